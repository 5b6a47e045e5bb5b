"""The learner's credit step: a packed batch and its scores in, advantages and value targets out.

The credit library (mtrl_jax/credit/) is pure math on a `CreditBatch`; this
room builds that batch from the rollout's `PackedBatch` and runs the
configured estimator as a program shared by every learner of the process
with the same estimator and options.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mtrl_jax.compile.programs import Program
from mtrl_jax.credit import registry as credit_registry
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.rollout.packing import PackedBatch


@dataclasses.dataclass(frozen=True)
class AdvantageProgram(Program):
  """The estimator `name` with `options` (programs.frozen of its keyword options), jitted:
  batch -> (adv_bt, value_target_bt or None)."""
  name: str
  options: tuple

  def build(self):
    return jax.jit(credit_registry.make_advantage_fn(self.name, **dict(self.options)))


def credit_batch(pb: PackedBatch, values_bt=None) -> CreditBatch:
  """The credit library's view of a packed batch (rewards, masks, ids, returns, values)."""
  return CreditBatch(
      reward_bt=jnp.asarray(pb.reward_bt), loss_mask_bt=jnp.asarray(pb.loss_mask_bt),
      turn_idx_bt=jnp.asarray(pb.turn_idx_bt), group_id_b=jnp.asarray(pb.group_id_b),
      episode_id_b=jnp.asarray(pb.episode_id_b), tree_id_b=jnp.asarray(pb.tree_id_b),
      return_b=jnp.asarray(pb.return_b), value_bt=None if values_bt is None else jnp.asarray(values_bt))


def monte_carlo_targets(batch: CreditBatch):
  """Undiscounted return-to-go on every action token: the critic's default target."""
  _, target = credit_registry.compute_advantages(
      "gae", batch._replace(value_bt=jnp.zeros_like(batch.reward_bt)), gamma=1.0, lambda_policy=1.0,
      lambda_critic=1.0)
  return target
