"""A progress head (SPA-RL, arXiv 2505.20732): how much each turn moved the episode.

The model is a trunk (the policy's architecture without an LM head) and a
scalar head, like the separate critic; what differs is what it is trained
for (train/progress.py): its outputs at the ends of an episode's turns are
that turn's share of the episode's return, and the shares are fitted to add
up to the return. `turn_shares` reads them out; credit/ gets them as an
array (`CreditBatch.progress_bt`) and never sees the model.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mtrl_jax.models.value import Critic


class ProgressModel(Critic):
  """Trunk + zero-initialised scalar head, one output per position: the critic's
  network, trained on a different target (per-turn shares of the return)."""


def turn_shares(out_bt: jax.Array, turn_end_bt: jax.Array) -> jax.Array:
  """Each turn's share, placed where the batch's rewards sit: f32 [B, T].

  `turn_end_bt` marks the target-aligned position of each turn's last
  action token (rollout/packing.py: position p predicts token p + 1). The
  share is the output one position later, whose input *is* that token, so
  the head has read the whole action; 0 elsewhere.
  """
  nxt = jnp.concatenate([out_bt[:, 1:], jnp.zeros_like(out_bt[:, :1])], axis=1)
  return jnp.where(turn_end_bt > 0, nxt, 0.0)
