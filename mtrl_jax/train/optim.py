"""Optimisers: AdamW with linear warm-up, cosine decay and global-norm clipping."""
from __future__ import annotations

import functools

import optax


# One object per recipe: optax transformations are pure functions, so equal arguments may share
# one, and the jitted steps built over it are then shared by every run in the process
# (mtrl_jax/compile/programs.py: a spec holding the transformation is equal when it is the same object).
@functools.lru_cache(maxsize=None)
def adamw(lr: float, total_steps: int, *, warmup_steps: int = 0, weight_decay: float = 0.0,
          clip_grad: float = 1.0, end_factor: float = 0.1) -> optax.GradientTransformation:
  """The one optimiser recipe every stage uses; `clip_grad <= 0` disables clipping."""
  total_steps = max(int(total_steps), 1)
  warmup_steps = min(int(warmup_steps), total_steps - 1) if total_steps > 1 else 0
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup_steps else lr, peak_value=lr, warmup_steps=warmup_steps,
      decay_steps=total_steps, end_value=lr * end_factor)
  parts = [optax.clip_by_global_norm(clip_grad)] if clip_grad > 0 else []
  parts.append(optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay))
  return optax.chain(*parts)
