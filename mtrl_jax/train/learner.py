"""The RL learner: finished sessions in, one policy (and critic) update out.

The learner does not know where sessions come from: the synchronous engine
and the async actor pool both hand it lists of finished `Session`s. It holds
the state (parameters, optimiser states, the reference policy, the policy
version, the non-finite counters) and the programs that move it; `update` is
a line of steps, each a function of the last one's record in the room that
owns it:

  sessions -(train/source)-> chosen -(rollout/packing)-> PackedBatch
  -(rollout/row_packing)-> RowPlan -(train/scoring)-> Scored
  -(train/credit_step)-> Credit -(train/rl_step)-> RLBatch -(train/rl_step)-> the epochs' steps.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from mtrl_jax.compile.programs import Tree, shared
from mtrl_jax.credit.losses import PolicyLossConfig
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.models import lora
from mtrl_jax.parallel.batch import num_batch_shards, put_global_batch
from mtrl_jax.parallel.sharded_init import state_shardings
from mtrl_jax.parallel.sharded_step import (init_opt_state, opt_state_shardings, replicated,
                                            sharding_context, split_trainable)
from mtrl_jax.rollout.packing import PackedBatch, pack_sessions
from mtrl_jax.rollout.row_packing import RowPlan, plan_rows
from mtrl_jax.rollout.session import Session
from mtrl_jax.train import critic_readout, credit_step, optim, scoring, source
from mtrl_jax.train import progress as progress_head
from mtrl_jax.train.credit_step import CreditSetup, credit_batch
from mtrl_jax.train.rl_step import (Frozen, LearnerState, RLBatch, RLStepProgram, ScoreProgram, StepFlags,
                                    ValuesProgram, join_state, keep_rows, rl_batch, run_epochs, split_state)
from mtrl_jax.train.scoring import Scored

CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")


class NonFiniteError(RuntimeError):
  pass


class Learner:
  """Holds the sharded learner state and the jitted functions that move it."""

  def __init__(self, c, mesh, rules, *, policy_gd, policy_params, critic_gd=None, critic_params=None,
               ref_params=None, total_updates: int, tokenizer=None):
    self.c, self.mesh, self.rules, self.tokenizer = c, mesh, rules, tokenizer
    rl = c.rl
    self.policy_gd, self.critic_gd = policy_gd, critic_gd
    self.head_critic = c.critic.kind == "head"
    self.version = 0
    self.nonfinite_in_a_row = 0
    self.nonfinite_total = 0
    self.last_aaw_session_ids: list[int] = []  # what the last rl.aaw update trained on
    self.loss_cfg = PolicyLossConfig(
        eps_low=rl.eps_low, eps_high=rl.eps_high, dual_clip=rl.dual_clip or None,
        agg=rl.aggregation, behav_cap=rl.is_cap if rl.decoupled else None,
        kl_coef=rl.kl_coef if rl.kl_mode == "loss" else 0.0, kl_kind=rl.kl_type,
        ent_coef=rl.entropy_coef,
        entropy_top_rho=None if rl.entropy_mask_rho >= 1.0 else rl.entropy_mask_rho,
        nll_coef=rl.nll_coef, max_turns=max(int(_max_turns(c)), 1))
    # The learned progress head of rl.estimator='progress' (train/progress.py): trained on each
    # update's sessions before their advantages; its per-turn shares go to credit/ as an array.
    self.progress = (progress_head.ProgressTrainer(c.progress.steps, c.progress.lr, seed=c.seed)
                     if rl.estimator == "progress" else None)
    self.credit_stats: dict = {}  # what the last `advantages` call reports (step groups, progress fit)
    steps = max(total_updates * rl.epochs * rl.minibatches, 1)
    self.tx_policy = optim.adamw(rl.lr, steps, warmup_steps=rl.warmup_steps,
                                 weight_decay=rl.weight_decay, clip_grad=rl.clip_grad)
    self.tx_critic = (optim.adamw(rl.critic_lr, steps, warmup_steps=rl.warmup_steps, clip_grad=rl.clip_grad)
                      if critic_gd is not None else None)

    # A network that carries LoRA adapters trains only them (and its value
    # head): the optimiser state covers that part, the base stays frozen.
    self.policy_trainable = lora_trainable(policy_params, "value_head")
    self.critic_trainable = lora_trainable(critic_params, "head")
    self.trainable = (self.policy_trainable, self.critic_trainable)
    self.shared_trunk = c.critic.kind == "lora"  # the critic state is adapters + head on the policy's trunk

    # Shardings of every piece of state, from the parameters' logical names.
    p_sh = state_shardings(policy_params, mesh, rules)
    c_sh = state_shardings(critic_params, mesh, rules) if critic_params is not None else {}
    op_sh = self._opt_shardings(self.tx_policy, policy_params, self.policy_trainable)
    oc_sh = (self._opt_shardings(self.tx_critic, critic_params, self.critic_trainable)
             if critic_params is not None else {})
    self.state_sh = LearnerState(p_sh, op_sh, c_sh, oc_sh)
    self.ref_sh = p_sh if ref_params is not None else None
    self.state = LearnerState(
        policy_params, init_opt_state(self.tx_policy, split_trainable(policy_params, self.policy_trainable)[0],
                                      op_sh),
        critic_params if critic_params is not None else {},
        init_opt_state(self.tx_critic, split_trainable(critic_params, self.critic_trainable)[0], oc_sh)
        if critic_params is not None else {})
    # With adapters the reference policy is only their starting values: its base is the policy's.
    self.ref_params = (jax.tree.map(jnp.copy, split_trainable(ref_params, self.policy_trainable)[0])
                       if ref_params is not None else None)

    rep = replicated(mesh)
    # Only the trainable parts are donated and returned; the frozen base goes in as
    # its own argument and keeps its arrays (the sampler may hold them).
    train_sh, frozen_sh = self._split(self.state_sh)
    # The jitted programs are shared by every learner of this process with an equal spec
    # (mtrl_jax/compile/programs.py): another run of equal shapes (a seed, an arm) compiles nothing.
    self._step_jit = shared(RLStepProgram(
        policy_gd, critic_gd, self.tx_policy, self.tx_critic, self.loss_cfg, value_coef=rl.value_coef,
        value_clip=rl.value_clip or None, decoupled=rl.decoupled, shared_trunk=self.shared_trunk,
        train_shardings=Tree(train_sh), frozen_shardings=Tree(frozen_sh), replicated=rep))
    self._score = shared(ScoreProgram(policy_gd, critic_gd, self.policy_trainable, self.shared_trunk, rep))
    self._values = (shared(ValuesProgram(policy_gd, critic_gd, self.shared_trunk, rep))
                    if critic_gd is not None or self.head_critic else None)
    self.decision_fn = env_registry.first_decision_fn(c.env.name)
    self.decision_value = env_registry.decision_value_fn(c.env.name, dict(c.env.kwargs))
    self.credit = CreditSetup.from_config(c)  # the estimator's program and the settings around it
    # The progress head's fit and shares, for the credit step (rl.estimator='progress').
    self._progress = self._progress_shares if self.progress is not None else None
    self.has_values = critic_gd is not None or self.head_critic
    self.pad_id = getattr(tokenizer, "pad_id", 0)
    # Update batches: rows a multiple of rl.minibatches x the mesh's data shards; lengths in
    # steps of 64 (power-of-two buckets would double the work of a batch just over a
    # boundary; a handful of shapes still compile).
    self.row_multiple = rl.minibatches * num_batch_shards(mesh, rules)
    self.packing = dict(layout=rl.layout, context=rl.context, tokenizer=tokenizer, batch_multiple=self.row_multiple,
                        pad_id=self.pad_id, length_buckets=tuple(range(64, c.rollout.context_cap + 64, 64)))

  def set_estimator(self, name: str, options: dict) -> None:
    """The advantage estimator `name` with its keyword options (the lab swaps it for a refit)."""
    self.credit.use(name, options)

  # ------------------------------------------------------------------ update
  def update(self, sessions: Sequence[Session], step: int, *, train_policy: bool = True,
             train_critic: bool = True, poison: float = 0.0, epochs: int | None = None) -> dict:
    """One RL update on finished sessions; returns host metrics.

    train_policy=False fits only the critic (value pretraining, critic
    warm-up); `epochs` overrides config.rl.epochs; `poison` scales the loss
    by (1 + poison), a test hook: NaN makes the loss and its gradients NaN.
    With config.rl.aaw the update trains only on the episodes drawn by
    `credit_step.aaw_draw` (see there).
    """
    c, rl = self.c, self.c.rl
    t0 = time.time()
    chosen = source.choose_sessions(sessions, self.version, dynamic_sampling=rl.dynamic_sampling)
    if not chosen.sessions:
      logging.warning("update %d: no trainable sessions; skipping", step)
      return {**chosen.stats, "update/skipped": 1.0}
    # Credit is per session: score (packed rows if rl.pack) -> unpack -> advantages
    # and targets in pb's one-session-per-row layout -> repack for the update.
    pb = pack_sessions(chosen.sessions, **self.packing)
    # With rl.pack several samples per row: rows as long as the one-per-row batch's (fewer
    # rows, same attention span), or rl.pack_len if longer.
    plan = (plan_rows(pb.length_b, max(int(rl.pack_len), pb.tokens_bt.shape[1]), row_multiple=self.row_multiple)
            if rl.pack else None)
    critic = self.state.critic if self.critic_gd is not None else None
    scored = scoring.score(self._score, self.state.policy, critic, self.ref_params, pb, plan, mesh=self.mesh,
                           rules=self.rules, pad_id=self.pad_id)
    credit = credit_step.credit(self.credit, pb, scored.values_bt if self.has_values else None,
                                scored.prox_logp_bt, scored.ref_logp_bt if self.ref_params is not None else None,
                                version=self.version, progress=self._progress, readout=self.has_values)
    batch = rl_batch(pb, plan, scored, credit, pad_id=self.pad_id)
    rows, row_len = batch.tokens_bt.shape
    stats = {**chosen.stats, **scoring.scored_stats(scored, pb, self.version), **credit.stats,
             "batch/pad_fraction": 1.0 - float(np.sum(pb.length_b)) / (rows * row_len)}
    if self.has_values:  # held-out fit: values from before this update's epochs
      stats.update(critic_readout.update_readout(chosen.sessions, pb, scored.values_bt, credit.target_bt,
                                                 credit.mc_bt, decision_fn=self.decision_fn,
                                                 value_fn=self.decision_value))
    if rl.aaw:  # only the drawn episodes' rows train
      aaw = credit_step.aaw_draw(pb, rl, c.seed, step, self.row_multiple)
      batch = keep_rows(batch, aaw)
      self.last_aaw_session_ids = sorted(chosen.sessions[i].session_id for i in aaw.sessions)
      stats["aaw/episodes_drawn"] = len(aaw.sessions)
    flags = StepFlags(jnp.float32(train_policy), jnp.float32(train_critic and self.has_values), jnp.float32(poison))
    done = run_epochs(self._step_jit, self.state, batch, flags, trainable=self.trainable,
                      epochs=rl.epochs if epochs is None else epochs, minibatches=rl.minibatches,
                      rng=np.random.default_rng([c.seed, step, 17]), mesh=self.mesh, rules=self.rules)
    self.state = done.state
    self._count_nonfinite(step, done.nonfinite)
    if train_policy:
      self.version += 1
    return {**done.metrics, **stats, "update/nonfinite_steps": done.nonfinite,
            "update/nonfinite_total": self.nonfinite_total, "update/seconds": time.time() - t0,
            "update/batch_rows": batch.tokens_bt.shape[0], "update/seq_len": row_len}

  def _count_nonfinite(self, step: int, nonfinite: float) -> None:
    """Counts refused minibatch steps; raises NonFiniteError after rl.max_nonfinite updates in a row had one."""
    self.nonfinite_total += int(nonfinite)
    if not nonfinite:
      self.nonfinite_in_a_row = 0
      return
    self.nonfinite_in_a_row += 1
    logging.warning("update %d: %d non-finite minibatch step(s) skipped (%d updates in a row)",
                    step, int(nonfinite), self.nonfinite_in_a_row)
    if self.nonfinite_in_a_row >= self.c.rl.max_nonfinite:
      raise NonFiniteError(
          f"{self.nonfinite_in_a_row} updates in a row had a non-finite loss or gradient "
          f"(config.rl.max_nonfinite={self.c.rl.max_nonfinite}); the last good state is kept in the "
          f"latest checkpoint. Lower config.rl.lr or check the rewards.")

  # ------------------------------------------------------------------ the steps, for callers outside update
  def _pack(self, sessions: Sequence[Session], multiple: int | None = None) -> PackedBatch:
    """Sessions as one padded batch; rows a multiple of `multiple` (default rl.minibatches) x data shards."""
    if multiple is None:
      return pack_sessions(sessions, **self.packing)
    return pack_sessions(sessions, **{**self.packing,
                                      "batch_multiple": int(multiple) * num_batch_shards(self.mesh, self.rules)})

  def _row_plan(self, pb: PackedBatch) -> Optional[RowPlan]:
    """With config.rl.pack, where each sample goes in rows holding several (None: one per row)."""
    if not self.c.rl.pack:
      return None
    return plan_rows(pb.length_b, max(int(self.c.rl.pack_len), pb.tokens_bt.shape[1]), row_multiple=self.row_multiple)

  def _put(self, tree):
    # Every host holds the whole batch (sessions are gathered from all hosts
    # before the update) and feeds the rows of its own devices.
    return put_global_batch(tree, self.mesh, self.rules)

  def score(self, pb: PackedBatch, plan: Optional[RowPlan] = None) -> Scored:
    """Proximal log-probs, reference log-probs and values, [B, T] host arrays of the batch `pb`
    (train/scoring.py; with a row plan, scored on packed rows)."""
    critic = self.state.critic if self.critic_gd is not None else None
    return scoring.score(self._score, self.state.policy, critic, self.ref_params, pb, plan, mesh=self.mesh,
                         rules=self.rules, pad_id=self.pad_id)

  def advantages(self, pb: PackedBatch, values_bt, logp_bt=None, ref_logp_bt=None):
    """(advantages, value targets) of `pb` (train/credit_step.py); `credit_stats` says what it reported."""
    out = credit_step.credit(self.credit, pb, values_bt if self.has_values else None, logp_bt,
                             ref_logp_bt if self.ref_params is not None else None, version=self.version,
                             progress=self._progress)
    self.credit_stats = out.stats
    return out.adv_bt, out.target_bt

  def _progress_shares(self, pb: PackedBatch):
    """The progress head (rl.estimator='progress') fitted on `pb`, then its per-turn shares: (shares, loss)."""
    if not self.progress.ready:
      self.progress.init_from_policy(self.policy_gd, self.state.policy)
    with sharding_context(self.mesh, self.rules):
      arrays = self._put(progress_head.arrays(pb))
      loss = self.progress.fit(arrays)
      return self.progress.shares(arrays), loss

  def mc_targets(self, pb: PackedBatch) -> np.ndarray:
    """Undiscounted return-to-go on every action token of a packed batch ([B, T], host)."""
    return np.asarray(self.credit.mc_fn(credit_batch(pb)))

  def critic_values(self, pb: PackedBatch) -> np.ndarray:
    """The critic's values [B, T] on a packed batch (one session per row), without the policy's log-probs."""
    with sharding_context(self.mesh, self.rules):
      dev = self._put((pb.tokens_bt, pb.positions_bt))
      critic = self.state.critic if self.critic_gd is not None else None
      return np.asarray(jax.device_get(self._values(self.state.policy, critic, *dev)))

  def critic_readout(self, sessions: Sequence[Session], pb: PackedBatch, values_bt, *, boot: int = 0,
                     seed: int = 0, with_oracle: bool = False):
    """train/critic_readout.py on a batch: the critic (values scored before any fit on it) against
    Monte-Carlo return-to-go and the oracle critic (`boot` > 0: with its session-bootstrap intervals,
    as critic_readout.readout). `with_oracle`: (readout, MC targets, oracle values) instead."""
    mc = self.mc_targets(pb)
    got = critic_readout.batch_readout(sessions, pb, values_bt, mc, decision_fn=self.decision_fn,
                                       value_fn=self.decision_value, boot=boot, seed=seed, with_oracle=with_oracle)
    return (got[0], mc, got[1]) if with_oracle else got

  # ------------------------------------------------------------------ helpers
  def _opt_shardings(self, tx, params, trainable):
    train = split_trainable(params, trainable)[0]
    return opt_state_shardings(tx, train, state_shardings(train, self.mesh, self.rules), self.mesh)

  def _split(self, state: LearnerState) -> tuple[LearnerState, Frozen]:
    """(the trainable parts with their optimiser states, the frozen parts) of a learner state."""
    return split_state(state, *self.trainable)

  def _join(self, train: LearnerState, frozen: Frozen) -> LearnerState:
    return join_state(train, frozen)

  def _step(self, train: LearnerState, batch: RLBatch, flags: StepFlags, frozen: Frozen = Frozen()):
    """The jitted update on (trainable state, device batch, flags, frozen parts); `train` is donated."""
    return self._step_jit(train, batch, flags, frozen)

  def step(self, batch: RLBatch, flags: StepFlags) -> dict:
    """One minibatch step on a device batch: the trainable state moves, the frozen parts stay."""
    train, frozen = self._split(self.state)
    new, met = self._step(train, batch, flags, frozen)
    self.state = self._join(new, frozen)
    return met

  def fresh_policy_opt(self):
    """A new optimiser state for the policy's trainable part (all of it, or its adapters)."""
    train = split_trainable(self.state.policy, self.policy_trainable)[0]
    return init_opt_state(self.tx_policy, train, self.state_sh.opt_policy)

  def snapshot_ref(self):
    """The current policy as the KL reference: a copy of its trainable part (all of it, or its adapters)."""
    return jax.tree.map(jnp.copy, split_trainable(self.state.policy, self.policy_trainable)[0])

  def policy_params_for_sampler(self):
    """The bare Transformer's params (without a value head) for the sampler."""
    return self.state.policy["policy"] if self.head_critic else self.state.policy


def lora_trainable(params, head: str):
  """What trains in a network's params: None (all) without LoRA adapters, else the adapters
  plus the value head (found by the path key `head`)."""
  if params is None or not lora.has_adapters(params):
    return None
  return nnx.Any(lora.ADAPTER, nnx.PathContains(head))


def _max_turns(c) -> int:
  from mtrl_jax.envs import registry as env_registry
  try:
    return int(env_registry.make(c.env.name, **dict(c.env.kwargs)).max_turns) + 1
  except Exception:  # an env that needs a live resource: fall back to a generous bound
    return 64
