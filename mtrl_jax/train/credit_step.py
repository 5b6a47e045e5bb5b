"""The learner's credit step: a packed batch and its scores in, advantages and value targets out.

The credit library (mtrl_jax/credit/) is pure math on a `CreditBatch`; this
room builds that batch from the rollout's `PackedBatch` and the learner's
scores, runs the configured estimator (a program shared by every learner of
the process with the same estimator and options), and applies what the RL
config adds around it: the KL penalty in the reward, the study's shuffled
control, Monte-Carlo targets for estimators without a critic target, and
absolute-advantage-weighted episode sampling (rl.aaw).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.compile.programs import Program, frozen
from mtrl_jax.credit import registry as credit_registry
from mtrl_jax.credit.aaw import aaw_sample
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.regularizers import kl_reward_penalty
from mtrl_jax.credit.shuffle import shuffle_advantages, shuffle_decision_advantages, valid_decision_rows
from mtrl_jax.credit.step_groups import step_group_stats
from mtrl_jax.credit.whiten import masked_whiten
from mtrl_jax.rollout.packing import PackedBatch

STEP_GROUP_ESTIMATORS = ("gigpo", "hgpo")  # they report how many turns found a step group


@dataclasses.dataclass(frozen=True)
class AdvantageProgram(Program):
  """The estimator `name` with `options` (programs.frozen of its keyword options), jitted:
  batch -> (adv_bt, value_target_bt or None)."""
  name: str
  options: tuple

  def build(self):
    return jax.jit(credit_registry.make_advantage_fn(self.name, **dict(self.options)))


class Credit(NamedTuple):
  """What the credit step gives the update: [B, T] advantages and value targets, and its metrics."""
  adv_bt: Any
  target_bt: Any
  stats: dict
  mc_bt: Any = None  # with `readout`: Monte-Carlo return-to-go of the batch's own rewards (the critic readout's)


@dataclasses.dataclass
class CreditSetup:
  """One learner's credit settings (from config.rl) and programs; `estimator` swapped by `use`."""
  seed: int
  kl_coef: float  # > 0 with kl_mode 'reward': the KL penalty enters the reward
  kl_type: str
  shuffle: bool  # rl.shuffle_advantages
  shuffle_scope: str = "all"  # rl.shuffle_scope: every action token, or the decision turn's (turn 0)
  shuffle_fraction: float = 1.0  # rl.shuffle_fraction: with scope 'decision', the share of sessions
  whiten: bool = False  # rl.whiten_advantages: mean 0, spread 1 over the update's action tokens
  max_turns: Optional[int] = None  # the step-group estimators' option, for their statistics
  estimator: str = ""
  adv_fn: Callable = None
  mc_fn: Callable = dataclasses.field(default_factory=lambda: jax.jit(monte_carlo_targets))
  groups_fn: Callable = dataclasses.field(
      default_factory=lambda: jax.jit(step_group_stats, static_argnames=("max_turns", "depth")))

  @classmethod
  def from_config(cls, c) -> "CreditSetup":
    rl = c.rl
    setup = cls(seed=int(c.seed), kl_coef=float(rl.kl_coef) if rl.kl_mode == "reward" else 0.0,
                kl_type=rl.kl_type, shuffle=bool(rl.shuffle_advantages), shuffle_scope=rl.shuffle_scope,
                shuffle_fraction=float(rl.shuffle_fraction), whiten=bool(rl.whiten_advantages))
    setup.use(rl.estimator, dict(rl.estimator_kwargs))
    return setup

  def use(self, name: str, options: dict) -> None:
    """The estimator `name` with its keyword options (validated here, naming the bad option)."""
    from mtrl_jax.compile.programs import shared
    credit_registry.make_advantage_fn(name, **options)
    self.estimator, self.max_turns = name, options.get("max_turns")
    self.adv_fn = shared(AdvantageProgram(name, frozen(options)))


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


def credit(setup: CreditSetup, pb: PackedBatch, values_bt=None, logp_bt=None, ref_logp_bt=None, *,
           version: int, progress: Optional[Callable] = None, readout: bool = False) -> Credit:
  """Advantages and value targets of `pb` (values_bt: the critic's, None without one).

  With kl_mode 'reward' and reference log-probs, the KL penalty is taken from the reward first.
  `progress(pb) -> (shares_bt, fit loss)`: the progress head's per-turn shares (rl.estimator
  'progress'). With rl.shuffle_advantages the advantages are permuted among the action tokens
  by a key of (seed, policy version): the same values, their pairing with the actions broken; with
  rl.shuffle_scope 'decision', only turn 0's credit, on rl.shuffle_fraction of the sessions whose
  turn-0 reply was valid (`pb.invalid_bt`; the graded control, credit/shuffle.py): a session with an
  invalid turn-0 reply keeps its credit, format penalty included. With rl.whiten_advantages the
  estimator's advantages are whitened over the batch's action tokens first (credit/whiten.py).
  `readout`: also the Monte-Carlo targets of the unpenalised rewards (train/critic_readout.py's).
  """
  reward = jnp.asarray(pb.reward_bt)
  if setup.kl_coef and ref_logp_bt is not None:
    reward = kl_reward_penalty(reward, logp_bt, ref_logp_bt, jnp.asarray(pb.loss_mask_bt), coef=setup.kl_coef,
                               kind=setup.kl_type)
  fields, stats = turn_fields(setup, pb, progress)
  batch = credit_batch(pb, values_bt)._replace(reward_bt=reward, **fields)
  adv, target = setup.adv_fn(batch)
  if setup.whiten:  # before the controls: they permute the whitened values, so their scale is the real arm's
    adv = _whiten(adv, batch.loss_mask_bt)
  if setup.shuffle:  # the study's positive control: same advantages, pairing broken
    key = jax.random.fold_in(jax.random.key(setup.seed + 31), version)
    if setup.shuffle_scope == "decision":
      if pb.invalid_bt is None:
        raise ValueError("rl.shuffle_scope='decision' draws only sessions whose decision reply was valid: the packed "
                         "batch needs invalid_bt (rollout/packing.pack_sessions fills it)")
      ok_b = valid_decision_rows(batch.loss_mask_bt, batch.turn_idx_bt, jnp.asarray(pb.invalid_bt))
      adv = _decision_shuffle(adv, batch.loss_mask_bt, batch.turn_idx_bt, key, setup.shuffle_fraction,
                              eligible_b=ok_b)
      stats.update(_eligible_stats(batch.loss_mask_bt, batch.turn_idx_bt, ok_b))
    else:
      adv = shuffle_advantages(adv, batch.loss_mask_bt, key)
  if target is None:
    target = setup.mc_fn(batch)
  return Credit(adv, target, stats, setup.mc_fn(credit_batch(pb)) if readout else None)


_whiten = jax.jit(masked_whiten)
_decision_shuffle = jax.jit(shuffle_decision_advantages, static_argnames=("decision_turn",))


def _eligible_stats(mask_bt, turn_idx_bt, ok_b) -> dict:
  """How many sessions (rows training turn 0) the graded control could draw from, of how many."""
  has_b = np.asarray(((mask_bt > 0) & (turn_idx_bt == 0)).any(axis=1))
  n_ok = int((has_b & np.asarray(ok_b)).sum())
  return {"credit/shuffle_eligible": n_ok, "credit/shuffle_eligible_fraction": n_ok / max(int(has_b.sum()), 1)}


def turn_fields(setup: CreditSetup, pb: PackedBatch, progress: Optional[Callable] = None) -> tuple[dict, dict]:
  """The per-turn inputs of the newer estimators (anchor state ids, turn rewards, progress shares)
  and what they report: for gigpo / hgpo how many turns found a step group, for progress the head's fit."""
  out, stats = {}, {}
  if pb.state_id_bt is not None:
    out["state_id_bt"] = jnp.asarray(pb.state_id_bt)
  if pb.turn_reward_bt is not None:
    out["turn_reward_bt"] = jnp.asarray(pb.turn_reward_bt)
  if progress is not None:
    shares, loss = progress(pb)
    out["progress_bt"] = jnp.asarray(shares)
    stats["progress/fit_loss"] = loss
  if setup.estimator in STEP_GROUP_ESTIMATORS:
    probe = credit_batch(pb)._replace(state_id_bt=out.get("state_id_bt"))
    counts = {k: int(v) for k, v in setup.groups_fn(probe, max_turns=setup.max_turns).items()}
    stats.update({"credit/step_turns": counts["turns"], "credit/step_keyed_turns": counts["keyed"],
                  "credit/step_grouped_turns": counts["grouped"],
                  "credit/step_grouped_fraction": counts["grouped"] / max(counts["turns"], 1)})
  return out, stats


# ------------------------------------------------------------------ absolute-advantage-weighted sampling
def aaw_rows(key, batch: CreditBatch, num: int, floor: float = 0.0, **adv_options):
  """bool[B]: every row of `num` episodes drawn by absolute-advantage-weighted sampling.

  What config.rl.aaw implements (ALGORITHMS.md, MS-GRPO item 2): the episode
  advantage A_i is the GRPO / MS-GRPO one, (R_i - mean_g R) / (std_g R + eps),
  over the whole batch; `num` distinct episodes are drawn without
  replacement with probability proportional to |A_i| + floor (uniform if all
  are 0; see `credit.aaw`); a drawn episode brings all its rows (every turn
  row in the per-turn layout).
  """
  keep_b, _, _, _ = aaw_sample(key, batch, num, floor=floor, **adv_options)
  return keep_b


class AAWDraw(NamedTuple):
  """The rows one update trains on under rl.aaw."""
  rows: np.ndarray  # row indices into the batch: the drawn episodes' rows, then undrawn filler rows
  trained: int  # rows[:trained] are the drawn ones; the filler rows carry no loss
  sessions: list  # the drawn sessions' indices into the packed list


def aaw_draw(pb: PackedBatch, rl, seed: int, step: int, row_multiple: int) -> AAWDraw:
  """The AAW-drawn episodes' rows, padded with undrawn rows to a multiple of `row_multiple` (shapes only).

  Advantages are computed on the whole batch first, so each drawn episode keeps its full-group baseline.
  """
  n_ep = len(set(pb.episode_id_b[pb.sample_valid_b > 0].tolist()))
  num = min(max(1, int(round(rl.aaw_fraction * n_ep))), n_ep)
  key = jax.random.fold_in(jax.random.key(seed), step)
  # The estimator's own advantage options, so AAW weighs by the advantage it trains with.
  options = {k: v for k, v in dict(rl.estimator_kwargs).items() if k in ("eps", "scale_by_std", "ddof")}
  keep = np.asarray(aaw_rows(key, credit_batch(pb), num, rl.aaw_floor, **options))
  rows = np.nonzero(keep)[0]
  n = -(-len(rows) // row_multiple) * row_multiple
  drawn = sorted(set(pb.session_index_b[rows].tolist()))
  return AAWDraw(np.concatenate([rows, np.nonzero(~keep)[0][:n - len(rows)]]), len(rows), drawn)
