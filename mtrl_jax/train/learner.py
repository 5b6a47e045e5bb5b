"""The RL learner: finished sessions in, one policy (and critic) update out.

The learner does not know where sessions come from: the synchronous engine
and the async actor pool both hand it lists of finished `Session`s. One call
to `update` packs them, scores them once (proximal and reference log-probs,
critic values), computes advantages with the configured estimator, and runs
`epochs x minibatches` donated steps of the jitted update.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from mtrl_jax.credit import registry as credit_registry
from mtrl_jax.credit.aaw import aaw_sample
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.losses import PolicyLossConfig
from mtrl_jax.credit.regularizers import kl_reward_penalty
from mtrl_jax.credit.shaping import informative_groups_np
from mtrl_jax.credit.shuffle import shuffle_advantages
from mtrl_jax.jit_reuse import shared_jit, tree_key
from mtrl_jax.models import lora
from mtrl_jax.credit.step_groups import step_group_stats
from mtrl_jax.parallel.batch import num_batch_shards, put_global_batch
from mtrl_jax.parallel.sharded_init import state_shardings
from mtrl_jax.parallel.sharded_step import (init_opt_state, join_trainable, opt_state_shardings, replicated,
                                            sharding_context, split_trainable)
from mtrl_jax.rollout.packing import PackedBatch, pack_sessions
from mtrl_jax.rollout.row_packing import RowPlan, pack_per_sample, pack_rows, plan_rows, unpack_rows
from mtrl_jax.rollout.session import Session
from mtrl_jax.train import optim
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.train import critic_readout
from mtrl_jax.train import progress as progress_head
from mtrl_jax.train.rl_step import (Frozen, LearnerState, RLBatch, StepFlags, make_rl_step, make_score_fn,
                                    make_values_fn)

CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")
STEP_GROUP_ESTIMATORS = ("gigpo", "hgpo")  # they report how many turns found a step group


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
    self.estimator = credit_registry.make_advantage_fn(rl.estimator, **dict(rl.estimator_kwargs))
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
    # The jitted programs are shared by every learner of this process with the same key
    # (mtrl_jax/jit_reuse.py): another run of equal shapes (a seed, an arm) compiles nothing.
    # The key holds every argument the built functions close over.
    step_args = (policy_gd, critic_gd, self.tx_policy, self.tx_critic, self.loss_cfg)
    step_kw = dict(value_coef=rl.value_coef, value_clip=rl.value_clip or None, decoupled=rl.decoupled,
                   shared_trunk=self.shared_trunk)
    self._step_jit = shared_jit(
        ("rl_step", *step_args, tuple(sorted(step_kw.items())), tree_key(train_sh), tree_key(frozen_sh), rep),
        lambda: jax.jit(make_rl_step(*step_args, **step_kw), in_shardings=(train_sh, None, rep, frozen_sh),
                        out_shardings=(train_sh, rep), donate_argnums=(0,)))
    # Replicated outputs: every host reads the whole batch's scores (multi-host included).
    self._score = shared_jit(
        ("score", policy_gd, critic_gd, self.policy_trainable, self.shared_trunk, rep),
        lambda: jax.jit(make_score_fn(policy_gd, critic_gd, policy_trainable=self.policy_trainable,
                                      shared_trunk=self.shared_trunk), out_shardings=rep))
    self._values = (shared_jit(("values", policy_gd, critic_gd, self.shared_trunk, rep),
                               lambda: jax.jit(make_values_fn(policy_gd, critic_gd, shared_trunk=self.shared_trunk),
                                               out_shardings=rep))
                    if critic_gd is not None or self.head_critic else None)
    self.decision_fn = env_registry.first_decision_fn(c.env.name)
    self.decision_value = env_registry.decision_value_fn(c.env.name, dict(c.env.kwargs))
    # The estimator is a partial of a registered function: its name and options are the program.
    self._adv = shared_jit(("advantages", rl.estimator, repr(sorted(dict(rl.estimator_kwargs).items()))),
                           lambda: jax.jit(self.estimator))
    self._mc_targets = jax.jit(monte_carlo_targets)
    self._step_group_stats = jax.jit(step_group_stats, static_argnames=("max_turns", "depth"))

  # ------------------------------------------------------------------ helpers
  def _opt_shardings(self, tx, params, trainable):
    train = split_trainable(params, trainable)[0]
    return opt_state_shardings(tx, train, state_shardings(train, self.mesh, self.rules), self.mesh)

  def _split(self, state: LearnerState) -> tuple[LearnerState, Frozen]:
    """(the trainable parts with their optimiser states, the frozen parts) of a learner state."""
    p_t, p_f = split_trainable(state.policy, self.policy_trainable)
    c_t, c_f = split_trainable(state.critic, self.critic_trainable)
    return LearnerState(p_t, state.opt_policy, c_t, state.opt_critic), Frozen(p_f, c_f)

  def _join(self, train: LearnerState, frozen: Frozen) -> LearnerState:
    return LearnerState(join_trainable(train.policy, frozen.policy), train.opt_policy,
                        join_trainable(train.critic, frozen.critic), train.opt_critic)

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

  @property
  def has_values(self) -> bool:
    return self.critic_gd is not None or self.head_critic

  def policy_params_for_sampler(self):
    """The bare Transformer's params (without a value head) for the sampler."""
    return self.state.policy["policy"] if self.head_critic else self.state.policy

  def _pack(self, sessions: Sequence[Session], multiple: int | None = None) -> PackedBatch:
    """Sessions as one padded batch; rows a multiple of `multiple` (default rl.minibatches) x data shards."""
    rl = self.c.rl
    multiple = (rl.minibatches if multiple is None else int(multiple)) * num_batch_shards(self.mesh, self.rules)
    # Lengths in steps of 64: power-of-two buckets would double the work of
    # a batch that is just over a boundary; a handful of shapes still compile.
    buckets = tuple(range(64, self.c.rollout.context_cap + 64, 64))
    return pack_sessions(sessions, layout=rl.layout, context=rl.context, tokenizer=self.tokenizer,
                         batch_multiple=multiple, pad_id=getattr(self.tokenizer, "pad_id", 0),
                         length_buckets=buckets)

  def _row_plan(self, pb: PackedBatch) -> Optional[RowPlan]:
    """With config.rl.pack, where each sample goes in rows holding several (None: one per row)."""
    if not self.c.rl.pack:
      return None
    multiple = self.c.rl.minibatches * num_batch_shards(self.mesh, self.rules)
    # Rows as long as the one-per-row batch's (fewer rows, same attention
    # span), or rl.pack_len if longer.
    row_len = max(int(self.c.rl.pack_len), pb.tokens_bt.shape[1])
    return plan_rows(pb.length_b, row_len, row_multiple=multiple)

  def _put(self, tree):
    # Every host holds the whole batch (sessions are gathered from all hosts
    # before the update) and feeds the rows of its own devices.
    return put_global_batch(tree, self.mesh, self.rules)

  # ------------------------------------------------------------------ scoring
  def score(self, pb: PackedBatch, plan: Optional[RowPlan] = None):
    """Proximal log-probs, reference log-probs and values, [B, T] host arrays of the batch `pb`.

    With a row plan the forward runs on packed rows (attention kept inside
    each segment) and the results are unpacked to pb's one-sample-per-row
    layout (0 beyond each sample's length).
    """
    pad = getattr(self.tokenizer, "pad_id", 0)
    with sharding_context(self.mesh, self.rules):
      if plan is None:
        dev = self._put((pb.tokens_bt, pb.targets_bt, pb.positions_bt))
      else:
        dev = self._put((pack_rows(pb.tokens_bt, plan, pad), pack_rows(pb.targets_bt, plan, pad),
                         pack_rows(pb.positions_bt, plan), plan.segment_ids_rl))
      critic = self.state.critic if self.critic_gd is not None else None
      out = jax.device_get(self._score(self.state.policy, critic, self.ref_params, *dev))
    if plan is None:
      return tuple(np.asarray(x) for x in out)
    return tuple(unpack_rows(x, plan, pb.tokens_bt.shape[1]) for x in out)

  def mc_targets(self, pb: PackedBatch) -> np.ndarray:
    """Undiscounted return-to-go on every action token of a packed batch ([B, T], host)."""
    return np.asarray(self._mc_targets(credit_batch(pb)))

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
    first, seen = first_turns(sessions, pb.session_index_b)
    out, oracle = critic_readout.readout_and_oracle(
        values_bt, mc, pb.loss_mask_bt, pb.turn_idx_bt, first_actions_b=first, group_b=pb.group_id_b,
        decision_fn=self.decision_fn, value_fn=self.decision_value, boot=boot, seed=seed,
        first_observations_b=seen)
    return (out, mc, oracle) if with_oracle else out

  def rl_batch(self, pb: PackedBatch, plan: Optional[RowPlan], prox, ref, adv, target, values) -> RLBatch:
    """The update's per-token fields ([B, T] host arrays) in the layout the step trains on."""
    per_token = dict(
        tokens_bt=pb.tokens_bt, targets_bt=pb.targets_bt, positions_bt=pb.positions_bt,
        loss_mask_bt=pb.loss_mask_bt, behav_logp_bt=pb.behav_logp_bt,
        prox_logp_bt=np.asarray(prox), ref_logp_bt=np.asarray(ref), adv_bt=np.asarray(adv),
        value_target_bt=np.asarray(target), old_value_bt=np.asarray(values),
        turn_idx_bt=pb.turn_idx_bt,
        success_bt=np.broadcast_to(pb.success_b[:, None], pb.tokens_bt.shape).copy())
    if plan is None:
      return RLBatch(**per_token)
    pad = getattr(self.tokenizer, "pad_id", 0)
    packed = {k: pack_rows(v, plan, pad if k in ("tokens_bt", "targets_bt") else 0)
              for k, v in per_token.items()}
    return RLBatch(**packed, segment_ids_bt=plan.segment_ids_rl)

  def advantages(self, pb: PackedBatch, values_bt, logp_bt=None, ref_logp_bt=None):
    rl = self.c.rl
    reward = jnp.asarray(pb.reward_bt)
    if rl.kl_coef and rl.kl_mode == "reward" and self.ref_params is not None:
      reward = kl_reward_penalty(reward, logp_bt, ref_logp_bt, jnp.asarray(pb.loss_mask_bt),
                                 coef=rl.kl_coef, kind=rl.kl_type)
    batch = credit_batch(pb, values_bt if self.has_values else None)._replace(reward_bt=reward,
                                                                              **self._turn_fields(pb))
    adv, target = self._adv(batch)
    if rl.get("shuffle_advantages", False):  # the study's positive control: same advantages, pairing broken
      adv = shuffle_advantages(adv, batch.loss_mask_bt, jax.random.fold_in(jax.random.key(self.c.seed + 31),
                                                                          self.version))
    if target is None:
      target = self._mc_targets(batch)
    return adv, target

  def _turn_fields(self, pb: PackedBatch) -> dict:
    """The per-turn inputs of the newer estimators: anchor state ids, turn rewards, progress shares.

    Sets `self.credit_stats`: for gigpo / hgpo how many turns found a step
    group, for progress the head's fit.
    """
    rl, out = self.c.rl, {}
    self.credit_stats = {}
    if pb.state_id_bt is not None:
      out["state_id_bt"] = jnp.asarray(pb.state_id_bt)
    if pb.turn_reward_bt is not None:
      out["turn_reward_bt"] = jnp.asarray(pb.turn_reward_bt)
    if self.progress is not None:
      if not self.progress.ready:
        self.progress.init_from_policy(self.policy_gd, self.state.policy)
      with sharding_context(self.mesh, self.rules):
        arrays = self._put(progress_head.arrays(pb))
        loss = self.progress.fit(arrays)
        out["progress_bt"] = jnp.asarray(self.progress.shares(arrays))
      self.credit_stats["progress/fit_loss"] = loss
    if rl.estimator in STEP_GROUP_ESTIMATORS:
      kw = dict(rl.estimator_kwargs)
      probe = CreditBatch(reward_bt=jnp.asarray(pb.reward_bt), loss_mask_bt=jnp.asarray(pb.loss_mask_bt),
                          turn_idx_bt=jnp.asarray(pb.turn_idx_bt), group_id_b=jnp.asarray(pb.group_id_b),
                          episode_id_b=jnp.asarray(pb.episode_id_b), tree_id_b=jnp.asarray(pb.tree_id_b),
                          return_b=jnp.asarray(pb.return_b), state_id_bt=out.get("state_id_bt"))
      counts = {k: int(v) for k, v in self._step_group_stats(probe, max_turns=kw.get("max_turns")).items()}
      self.credit_stats.update({"credit/step_turns": counts["turns"],
                                "credit/step_keyed_turns": counts["keyed"],
                                "credit/step_grouped_turns": counts["grouped"],
                                "credit/step_grouped_fraction": counts["grouped"] / max(counts["turns"], 1)})
    return out

  # ------------------------------------------------------------------ update
  def update(self, sessions: Sequence[Session], step: int, *, train_policy: bool = True,
             train_critic: bool = True, poison: float = 0.0, epochs: int | None = None) -> dict:
    """One RL update on finished sessions; returns host metrics.

    train_policy=False fits only the critic (value pretraining, critic
    warm-up); `epochs` overrides config.rl.epochs; `poison` scales the loss
    by (1 + poison), a test hook: NaN makes the loss and its gradients NaN.
    With config.rl.aaw the update trains only on the episodes drawn by
    `aaw_rows` (see there).
    """
    c, rl = self.c, self.c.rl
    t0 = time.time()
    stats: dict[str, Any] = {}
    trainable = [s for s in sessions if s.trainable]
    stats["sessions/untrainable"] = len(sessions) - len(trainable)
    if rl.dynamic_sampling:
      keep, dropped = informative_groups_np([s.group_id for s in trainable],
                                            [s.episode_return for s in trainable])
      stats["sessions/dropped_uninformative_groups"] = dropped
      trainable = [s for s, k in zip(trainable, keep) if k]
    stats["sessions/trained"] = len(trainable)
    # Measured from the versions recorded on the tokens, whatever the source claims.
    oldest = [v for v in (s.min_version() for s in trainable) if v is not None]
    stats["update/staleness_max"] = float(max((self.version - v for v in oldest), default=0))
    if not trainable:
      logging.warning("update %d: no trainable sessions; skipping", step)
      return {**stats, "update/skipped": 1.0}
    pb = self._pack(trainable)
    # Credit is per session: score (packed rows if rl.pack) -> unpack -> advantages
    # and targets in pb's one-session-per-row layout -> repack for the update.
    plan = self._row_plan(pb)
    prox, ref, values = self.score(pb, plan)
    stats.update(sampler_mismatch(prox, pb.behav_logp_bt, pb.loss_mask_bt, pb.version_bt, self.version))
    adv, target = self.advantages(pb, values, prox, ref)
    stats.update(self.credit_stats)
    full = self.rl_batch(pb, plan, prox, ref, adv, target, values)
    rows, row_len = full.tokens_bt.shape
    stats["batch/pad_fraction"] = 1.0 - float(np.sum(pb.length_b)) / (rows * row_len)
    if rl.get("aaw", False):
      full, drawn = self._aaw_subsample(pb, full, step)
      self.last_aaw_session_ids = sorted(trainable[i].session_id for i in drawn)
      stats["aaw/episodes_drawn"] = len(drawn)
    rows = full.tokens_bt.shape[0]
    if self.has_values:
      # Held-out fit of the critic: values from before this update's epochs, against the
      # estimator's targets, and (the readout) against Monte-Carlo returns beside the oracle's.
      stats["value/explained_variance_before"] = _explained_variance(
          np.asarray(values), np.asarray(target), pb.loss_mask_bt)
      stats.update({f"value/{k}": v for k, v in self.critic_readout(trainable, pb, np.asarray(values)).items()})
    flags = StepFlags(jnp.float32(train_policy), jnp.float32(train_critic and self.has_values),
                      jnp.float32(poison))
    b = rows
    mb = b // rl.minibatches
    rng = np.random.default_rng([c.seed, step, 17])
    metrics_acc: list = []
    with sharding_context(self.mesh, self.rules):
      for _ in range(rl.epochs if epochs is None else epochs):
        perm = rng.permutation(b)
        for m in range(rl.minibatches):
          idx = perm[m * mb:(m + 1) * mb]
          part = self._put(jax.tree.map(lambda x: np.asarray(x)[idx], full))
          met = self.step(part, flags)
          metrics_acc.append(met)
    host = jax.device_get(metrics_acc)
    nonfinite = sum(float(m["nonfinite"]) for m in host)
    self.nonfinite_total += int(nonfinite)
    if nonfinite:
      self.nonfinite_in_a_row += 1
      logging.warning("update %d: %d non-finite minibatch step(s) skipped (%d updates in a row)",
                      step, int(nonfinite), self.nonfinite_in_a_row)
      if self.nonfinite_in_a_row >= rl.max_nonfinite:
        raise NonFiniteError(
            f"{self.nonfinite_in_a_row} updates in a row had a non-finite loss or gradient "
            f"(config.rl.max_nonfinite={rl.max_nonfinite}); the last good state is kept in the "
            f"latest checkpoint. Lower config.rl.lr or check the rewards.")
    else:
      self.nonfinite_in_a_row = 0
    if train_policy:
      self.version += 1
    out = _mean_metrics(host)
    out.update(stats)
    out["update/nonfinite_steps"] = nonfinite
    out["update/nonfinite_total"] = self.nonfinite_total
    out["update/seconds"] = time.time() - t0
    out["update/batch_rows"] = b
    out["update/seq_len"] = row_len
    out["update/ratio_prox_behav_max"] = float(_masked_max(np.exp(np.asarray(prox) - pb.behav_logp_bt),
                                                           pb.loss_mask_bt))
    return out

  def _aaw_subsample(self, pb: PackedBatch, full: RLBatch, step: int):
    """The rows of the AAW-drawn episodes, padded with masked rows to the batch multiple.

    Advantages were computed on the whole batch first, so each drawn
    episode keeps its full-group baseline. Returns (batch, drawn session
    indices into the packed list).
    """
    rl = self.c.rl
    n_ep = len(set(pb.episode_id_b[pb.sample_valid_b > 0].tolist()))
    num = min(max(1, int(round(rl.aaw_fraction * n_ep))), n_ep)
    credit = credit_batch(pb)
    key = jax.random.fold_in(jax.random.key(self.c.seed), step)
    keep = np.asarray(aaw_rows(key, credit, num, rl.aaw_floor, **_aaw_options(rl)))
    rows = np.nonzero(keep)[0]
    multiple = rl.minibatches * num_batch_shards(self.mesh, self.rules)
    n = -(-len(rows) // multiple) * multiple
    idx = np.concatenate([rows, np.nonzero(~keep)[0][:n - len(rows)]])
    out = jax.tree.map(lambda x: np.asarray(x)[idx], full)
    mask = np.array(out.loss_mask_bt)
    mask[len(rows):] = 0.0  # filler rows: shapes only, no loss
    drawn = sorted(set(pb.session_index_b[rows].tolist()))
    return out._replace(loss_mask_bt=mask), drawn


MISMATCH_RATIO_BAND = (0.9, 1.1)


def first_turns(sessions: Sequence[Session], session_index_b) -> tuple[list, list]:
  """Each row's session's turn-0 action and observation (None, None on a padding row): the critic
  readout's decision (Env.first_decision) reads both."""
  turns = [sessions[i].turns[0] if i >= 0 and sessions[i].turns else None for i in session_index_b]
  return [t and t.action for t in turns], [t and t.observation for t in turns]


def sampler_mismatch(prox_logp_bt, behav_logp_bt, loss_mask_bt, version_bt, version: int) -> dict:
  """Trainer/sampler mismatch: |behaviour log-prob - learner's log-prob| on the
  generated tokens of the CURRENT policy version (same weights on both sides).

  The sampler (cached decode, one token at a time) and the learner (one
  cache-free forward of the whole row) compute the same function with
  different kernels and summation orders: in float32 the gap is float noise
  (~1e-6); in bfloat16 it is what decoupled-PPO ratios and IS caps absorb.
  Tokens of older versions are left out (their gap is staleness, not numerics).
  Only meaningful at temperature 1 without top-k/top-p (the behaviour
  log-prob is that of the distribution actually sampled).
  """
  cur = (np.asarray(loss_mask_bt) > 0) & (np.asarray(version_bt) == int(version))
  diff = (np.asarray(prox_logp_bt, np.float64) - np.asarray(behav_logp_bt, np.float64))[cur]
  gap = np.abs(diff)
  # The share of tokens whose importance ratio pi_learner / pi_sampler leaves
  # [0.9, 1.1] (the band TRL reports: 7.5% between vLLM and a bf16 trainer).
  lo, hi = MISMATCH_RATIO_BAND
  out_of_band = (diff < np.log(lo)) | (diff > np.log(hi))
  return {"mismatch/logp_abs_mean": float(gap.mean()) if gap.size else 0.0,
          "mismatch/logp_abs_max": float(gap.max()) if gap.size else 0.0,
          "mismatch/ratio_out_share": float(out_of_band.mean()) if gap.size else 0.0,
          "mismatch/tokens": float(gap.size)}


def lora_trainable(params, head: str):
  """What trains in a network's params: None (all) without LoRA adapters, else the adapters
  plus the value head (found by the path key `head`)."""
  if params is None or not lora.has_adapters(params):
    return None
  return nnx.Any(lora.ADAPTER, nnx.PathContains(head))


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


def _aaw_options(rl) -> dict:
  """The estimator's own advantage options, so AAW weighs by the advantage it trains with."""
  return {k: v for k, v in dict(rl.estimator_kwargs).items() if k in ("eps", "scale_by_std", "ddof")}


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


def _max_turns(c) -> int:
  from mtrl_jax.envs import registry as env_registry
  try:
    return int(env_registry.make(c.env.name, **dict(c.env.kwargs)).max_turns) + 1
  except Exception:  # an env that needs a live resource: fall back to a generous bound
    return 64


def _explained_variance(v, t, m) -> float:
  m = np.asarray(m) > 0
  if m.sum() < 2:
    return 0.0
  var_t = np.var(t[m])
  return float(1.0 - np.var(t[m] - v[m]) / var_t) if var_t > 1e-12 else 0.0


def _masked_max(x, m):
  m = np.asarray(m) > 0
  return float(np.max(np.where(m, x, 0.0))) if m.any() else 0.0


def _mean_metrics(ms: list) -> dict:
  out = {}
  for k in ms[0]:
    vals = [np.asarray(m[k]) for m in ms]
    if vals[0].ndim == 0:
      out[k] = float(np.mean(vals))
    else:
      arr = np.mean(np.stack(vals), axis=0)
      for i, v in enumerate(arr):
        out[f"{k}/{i}"] = float(v)
  return out
