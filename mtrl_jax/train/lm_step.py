"""Next-token (SFT / behaviour-cloning) training step: masked cross-entropy, sharded and donated.

    mesh = make_mesh((-1, 1, 1)); rules = get_rules("default")
    trainer = build_lm_trainer(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), optax.adamw(1e-4), mesh, rules)
    for batch in batches:                       # LMBatch of host numpy arrays
      metrics = trainer.train_step(batch)       # device scalars; fetch on log steps
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from mtrl_jax.compile.programs import Program, Tree
from mtrl_jax.models.logprobs import token_stats
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel.batch import shard_batch
from mtrl_jax.parallel.rules import Rules
from mtrl_jax.parallel.sharded_init import create_sharded, state_shardings
from mtrl_jax.parallel.sharded_step import (ShardedFn, init_opt_state, make_train_step,
                                            opt_state_shardings)


class LMBatch(NamedTuple):
  """Token rows and which of their positions are trained as targets.

  loss_mask_bt[b, t] = 1 makes token t a target predicted from tokens < t
  (so column 0 never counts); padding and observation tokens carry 0.
  With several sequences per row (packing), segment_ids_bt gives each
  token's sequence (1, 2, ...; 0 on padding) and positions_bt its position
  within it; a token is then never a target across a segment boundary.
  """
  tokens_bt: Any  # int32 [B, T]
  loss_mask_bt: Any  # [B, T], 0/1 (any numeric dtype)
  positions_bt: Any = None  # int32 [B, T] or None (= 0..T-1)
  segment_ids_bt: Any = None  # int32 [B, T] or None (one sequence per row)


def lm_loss(model: Transformer, batch: LMBatch) -> tuple:
  """Mean cross-entropy over the counted target tokens of the whole (global) batch.

  Every counted token weighs the same, whatever its row's length. Returns
  (loss, {"n_tokens", "accuracy"}).
  """
  tokens, seg = batch.tokens_bt, batch.segment_ids_bt
  packed = {} if seg is None else dict(positions_bt=batch.positions_bt[:, :-1],
                                       segment_ids_bt=seg[:, :-1])
  h_btd, _ = model.hidden(tokens[:, :-1], **packed)
  targets_bt = tokens[:, 1:]
  mask_bt = batch.loss_mask_bt[:, 1:].astype(jnp.float32)
  if seg is not None:
    mask_bt = mask_bt * (seg[:, 1:] == seg[:, :-1])
  # Log-probs and argmax-correctness straight from the hidden states, in
  # chunks of model.cfg.logits_chunk positions: no whole [B, T, V] logits.
  stats = token_stats(model, h_btd, targets_bt)
  n_tokens = jnp.sum(mask_bt)
  denom = jnp.maximum(n_tokens, 1.0)
  loss = -jnp.sum(stats.logp_bt * mask_bt) / denom
  return loss, {"n_tokens": n_tokens, "accuracy": jnp.sum(stats.correct_bt * mask_bt) / denom}


def lm_loss_fn(graphdef: nnx.GraphDef) -> Callable:
  """lm_loss over split state: f(params, batch) -> (loss, metrics)."""
  def loss_fn(params, batch):
    return lm_loss(nnx.merge(graphdef, params), batch)
  return loss_fn


def make_lm_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, mesh: Mesh,
                       rules: Rules, param_shardings, opt_shardings, *, donate: bool = True,
                       frozen_shardings=None) -> ShardedFn:
  """step(params, opt_state, batch) -> (params, opt_state, metrics); params/opt_state donated.

  With `frozen_shardings`: step(params, opt_state, batch, frozen), where params
  is the trained part (LoRA adapters) and frozen the rest (see make_train_step).
  """
  return make_train_step(lm_loss_fn(graphdef), optimizer, mesh=mesh, rules=rules,
                         param_shardings=param_shardings, opt_shardings=opt_shardings, donate=donate,
                         frozen_shardings=frozen_shardings)


@dataclasses.dataclass(frozen=True)
class LMStepProgram(Program):
  """The sft stage's step (make_lm_train_step), shared by every run of the process with an equal spec
  (mtrl_jax/compile/programs.py): `optimizer` is one object per recipe (train/optim.py)."""
  graphdef: nnx.GraphDef
  optimizer: optax.GradientTransformation
  mesh: Mesh
  rules: tuple
  param_shardings: Tree
  opt_shardings: Tree
  frozen_shardings: Tree

  def build(self) -> ShardedFn:
    return make_lm_train_step(self.graphdef, self.optimizer, self.mesh, self.rules, self.param_shardings.value,
                              self.opt_shardings.value, frozen_shardings=self.frozen_shardings.value)


def split_params(model: nnx.Module):
  """(graphdef, params) of a model whose state is all nnx.Param; names any other variable."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  others = [("/".join(map(str, p)), type(v).__name__) for p, v in nnx.to_flat_state(rest)]
  if others:
    raise ValueError(f"the train step carries only nnx.Param state; the model also holds {others}")
  return graphdef, params


@dataclasses.dataclass
class LMTrainer:
  """Sharded params + optimizer state and the jitted step that advances them."""
  graphdef: nnx.GraphDef
  params: Any
  opt_state: Any
  step_fn: ShardedFn
  mesh: Mesh
  rules: Rules
  param_shardings: Any
  opt_shardings: Any

  def train_step(self, batch: LMBatch) -> dict:
    """One update on a host batch (this host's rows when multi-host); returns device metrics."""
    device_batch = shard_batch(LMBatch(*batch), self.mesh, self.rules)
    self.params, self.opt_state, metrics = self.step_fn(self.params, self.opt_state, device_batch)
    return metrics

  def model(self) -> nnx.Module:
    """The current model (shares the trainer's arrays: the next step donates them)."""
    return nnx.merge(self.graphdef, self.params)


def build_lm_trainer(model_factory: Callable[[], nnx.Module], optimizer: optax.GradientTransformation,
                     mesh: Mesh, rules: Rules, *, strict: bool = False) -> LMTrainer:
  """Creates the model sharded, the optimizer state sharded alike, and the donated step."""
  model = create_sharded(model_factory, mesh, rules, strict=strict)
  graphdef, params = split_params(model)
  param_shardings = state_shardings(params, mesh, rules, strict=strict)
  opt_shardings = opt_state_shardings(optimizer, params, param_shardings, mesh)
  opt_state = init_opt_state(optimizer, params, opt_shardings)
  step_fn = make_lm_train_step(graphdef, optimizer, mesh, rules, param_shardings, opt_shardings)
  return LMTrainer(graphdef, params, opt_state, step_fn, mesh, rules, param_shardings, opt_shardings)
