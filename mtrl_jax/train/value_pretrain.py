"""Value pretraining: fit the critic to the warm-start policy's returns before RL (VC-PPO).

A critic that starts RL unable to tell good states from bad ones turns GAE's
bootstrapped advantages into noise; VC-PPO (arXiv 2503.01491, section 3.2)
fits it first on rollouts of the frozen initial policy. This stage:

* plays fresh rounds of `tasks_per_round` tasks x `rl.group_size` sessions
  with the policy frozen (a new batch every round: nothing to overfit), and
  fits the critic on each with plain MSE for `epochs` passes of
  `minibatches` minibatches;
* targets Monte-Carlo return-to-go (gamma 1, lambda 1) by default, as VC-PPO
  does: a bootstrapped lambda < 1 target from a critic that knows nothing
  yet teaches it its own zeros (`targets="estimator"` keeps the RL
  estimator's critic targets, which the lab's coupled critic wants);
* has an optimiser and a learning-rate schedule of its own (constant after
  `warmup_steps`), and hands RL a fresh optimiser state: RL's critic
  schedule starts at its step 0 whatever pretraining did. While the stage
  runs, its Adam state sits in the learner's critic slot (`opt_critic`, or
  `opt_policy` for a value head), so a checkpoint taken mid-stage resumes
  it exactly;
* keeps fitting while its held-out readout (each round's fresh batch, scored
  before fitting it) still improves, and stops at the bar, at a target ratio,
  on a plateau, or at its caps in critic steps (`steps`) and wall seconds
  (`max_seconds`): train/vp_stop.py holds the rule, a pure function of the
  rounds' readouts; the stage logs why it stopped (`stopped_at_<reason>`);
* reports, every round, the critic readout of train/critic_readout.py
  (held-out EV and R^2, and on probes that declare their decision, the
  oracle critic's beside them and the critic's error at the decision);
* scores the critic it hands to RL once more, on `readout_tasks` fresh
  tasks (0: one round's worth) played in rounds of `tasks_per_round` and
  read as one set, with session-bootstrap 95% intervals of its EV, the
  oracle's and their ratio: the study judges "EV >= 0.8 x the oracle's" on
  the ratio's interval, which one round's 128 sessions leave too wide.
* stops at the bar only when that final readout agrees. The pooled window
  mixes the critics of its last `window` rounds and one round's oracle EV
  swings with its batch, so it can read at the bar while the critic being
  handed over is not: a pilot at H=32 (2026-11-29) stopped on a window of
  0.948 [0.872, 1.03] and handed RL a critic that read 0.419 [0.33, 0.51]
  on 256 fresh tasks. When the window fires, the stage plays the final
  readout; at the bar on its interval, it stops with that readout (the same
  tasks and numbers as before this check existed); otherwise it says so,
  keeps fitting, and lets the window fire again only after `window` new
  rounds, each later readout on tasks no earlier one played.

The head critic (critic.kind='head') trains only the head: the trunk's hidden
states are stop-gradient, and the trunk's parameters are kept bit for bit.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx

from mtrl_jax.compile.programs import Program, Tree, shared
from mtrl_jax.metrics import Progress, say
from mtrl_jax.models.value import PolicyWithValueHead
from mtrl_jax.parallel.host_exchange import allgather_objects
from mtrl_jax.parallel.sharded_step import (init_opt_state, opt_state_shardings, replicated,
                                            sharding_context)
from mtrl_jax.train import critic_bar, critic_readout, optim, vp_stop
from mtrl_jax.train.critic_readout import first_turns
from mtrl_jax.train.rl_step import critic_values
from mtrl_jax.train.source import SyncSource

TARGETS = ("mc", "estimator")
BOOT = 2000  # session resamples of the final readout's intervals (milliseconds at 1,000 sessions)
WINDOW_BOOT = 1000  # of the stopping rule's pooled ratio, every round
STOPPED = {"bar": "the critic is at the bar", "ratio": "the ratio reached value_pretrain.stop_at_ratio",
           "steps": "the cap value_pretrain.steps", "seconds": "the cap value_pretrain.max_seconds",
           "plateau": "the held-out readout stopped improving"}


class ValueBatch(NamedTuple):
  tokens_bt: jax.Array
  positions_bt: jax.Array
  target_bt: jax.Array
  mask_bt: jax.Array


def _is_head_path(path) -> bool:
  return any(getattr(k, "key", None) == "value_head" for k in path)


def make_value_fit_step(policy_gd, critic_gd, tx: optax.GradientTransformation):
  """step(params, opt_state, batch) -> (params, opt_state, metrics): one MSE step of the critic.

  `params` is the separate critic's state, or (critic_gd None) the policy's
  state with a value head, of which only the head moves. A non-finite loss or
  gradient leaves params and optimiser state unchanged (`nonfinite` = 1).
  """
  head = critic_gd is None

  def values_of(params, batch: ValueBatch):
    if head:
      model = nnx.merge(policy_gd, params)
      h, _ = model.policy.hidden(batch.tokens_bt, positions_bt=batch.positions_bt)
      return model.value_head(jax.lax.stop_gradient(h))
    return critic_values(critic_gd, params, batch.tokens_bt, batch.positions_bt)

  def loss_fn(params, batch: ValueBatch):
    m = batch.mask_bt > 0
    err = jnp.where(m, values_of(params, batch) - batch.target_bt, 0.0)
    return jnp.sum(err * err) / jnp.maximum(jnp.sum(m), 1)

  def step(params, opt_state, batch: ValueBatch):
    loss, g = jax.value_and_grad(loss_fn)(params, batch)
    gn = optax.global_norm(g)
    ok = jnp.isfinite(loss) & jnp.isfinite(gn)
    upd, new_opt = tx.update(g, opt_state, params)
    new = optax.apply_updates(params, upd)
    if head:  # the trunk's grads are 0 already; keep it bit for bit all the same
      new = jax.tree_util.tree_map_with_path(lambda p, n, o: n if _is_head_path(p) else o, new, params)
    params = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, params)
    opt_state = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_opt, opt_state)
    return params, opt_state, {"fit_loss": loss, "grad_norm": gn, "nonfinite": (~ok).astype(jnp.float32)}

  return step


@dataclasses.dataclass(frozen=True)
class ValueFitProgram(Program):
  """make_value_fit_step jitted with its shardings and donation: one per equal spec in the process."""
  policy_gd: Any
  critic_gd: Any
  tx: optax.GradientTransformation  # one object per recipe (train/optim.py)
  param_shardings: Tree
  opt_shardings: Tree
  replicated: Any
  donate: tuple

  def build(self):
    p_sh, o_sh = self.param_shardings.value, self.opt_shardings.value
    return jax.jit(make_value_fit_step(self.policy_gd, self.critic_gd, self.tx), in_shardings=(p_sh, o_sh, None),
                   out_shardings=(p_sh, o_sh, self.replicated), donate_argnums=self.donate)


def check_supported(c) -> None:
  """Value pretraining fits a full separate critic, or a value head on a fully
  trained policy; it has no path for LoRA critics (adapters on a frozen trunk)
  yet. Raised when the stage starts, naming the field."""
  if c.critic.kind == "lora":
    raise ValueError("config.value_pretrain.enabled: value pretraining of a critic.kind='lora' critic is not "
                     "implemented; set value_pretrain.enabled=False")
  if c.critic.kind == "head" and c.model.lora.rank > 0:
    raise ValueError("config.value_pretrain.enabled: value pretraining of a value head on a LoRA policy is not "
                     "implemented; use critic.kind='separate' or set value_pretrain.enabled=False")


class ValuePretrainer:
  """The optimiser, jitted step and data handling of value pretraining for one learner."""

  def __init__(self, learner, c):
    v = c.value_pretrain
    if v.targets not in TARGETS:
      raise ValueError(f"config.value_pretrain.targets={v.targets!r}: choose one of {TARGETS}")
    self.learner, self.c, self.v = learner, c, v
    self.head = learner.head_critic
    L = learner
    self.tx = optim.adamw(v.lr, max(int(v.steps), 1), warmup_steps=v.warmup_steps, clip_grad=c.rl.clip_grad,
                          end_factor=1.0)
    self.p_sh = L.state_sh.policy if self.head else L.state_sh.critic
    self.o_sh = opt_state_shardings(self.tx, self.params, self.p_sh, L.mesh)
    rep = replicated(L.mesh)
    # A value head's params are the whole policy, whose trunk arrays the sampler holds
    # (and plays the next round with): donating them deleted the sampler's weights (a
    # crash in the second round's rollouts). Only the optimiser state is donated then.
    # Shared by every run of this process with an equal spec (mtrl_jax/compile/programs.py): a
    # second run of equal shapes compiles no step.
    donate = (1,) if self.head else (0, 1)
    self._step = shared(ValueFitProgram(L.policy_gd, L.critic_gd, self.tx, Tree(self.p_sh), Tree(self.o_sh), rep,
                                        donate))

  # The critic's parameters and the slot its optimiser state lives in during the stage.
  @property
  def params(self):
    return self.learner.state.policy if self.head else self.learner.state.critic

  @property
  def opt(self):
    return self.learner.state.opt_policy if self.head else self.learner.state.opt_critic

  def _set(self, params, opt):
    st = self.learner.state
    self.learner.state = (st._replace(policy=params, opt_policy=opt) if self.head
                          else st._replace(critic=params, opt_critic=opt))

  def start_optimiser(self):
    """A fresh pretraining optimiser state in the critic's slot (the stage's first round)."""
    self._set(self.params, init_opt_state(self.tx, self.params, self.o_sh))

  def hand_over_to_rl(self):
    """The RL critic optimiser, fresh: RL's schedule starts at its step 0."""
    L = self.learner
    if self.head:
      self._set(self.params, init_opt_state(L.tx_policy, self.params, L.state_sh.opt_policy))
    else:
      self._set(self.params, init_opt_state(L.tx_critic, self.params, L.state_sh.opt_critic))

  # ------------------------------------------------------------------ one batch
  def targets(self, pb, values_bt):
    """The training targets of a packed batch: MC return-to-go, or the estimator's critic targets."""
    L = self.learner
    if self.v.targets == "estimator":
      return np.asarray(L.advantages(pb, jnp.asarray(values_bt))[1])
    return L.mc_targets(pb)

  def readout(self, sessions, pb, values_bt) -> dict:
    """The critic readout (held-out: `values_bt` were scored before fitting on `pb`). Its per-session
    statistics (critic_readout.session_stats, the oracle's beside the critic's) are kept in
    `last_stats` for the stopping rule's pooled ratio."""
    out, mc, oracle = self.learner.critic_readout(sessions, pb, values_bt, with_oracle=True)
    self.last_stats = critic_readout.session_stats(values_bt, mc, pb.loss_mask_bt, oracle)
    return out

  def final_readout(self, batches) -> dict:
    """The readout of the critic handed to RL on several fresh batches read as one set, with intervals.

    `batches`: (sessions, packed batch, values) per round. Each batch's targets are its own MC
    return-to-go; the oracle is critic_readout.readout's on the concatenation (folds by group parity,
    group ids made distinct across batches: pack_sessions numbers each batch's groups from 0).
    """
    L = self.learner
    width = max(pb.tokens_bt.shape[1] for _, pb, _ in batches)
    pad = lambda x: np.pad(np.asarray(x), [(0, 0), (0, width - np.shape(x)[1])])  # noqa: E731
    values, mc, mask, turn, first, seen, group = [], [], [], [], [], [], []
    offset = 0
    for sessions, pb, values_bt in batches:
      values.append(pad(values_bt))
      mc.append(pad(L.mc_targets(pb)))
      mask.append(pad(pb.loss_mask_bt))
      turn.append(pad(pb.turn_idx_bt))
      # as Learner.critic_readout: the row's session's turn-0 action and observation (None: padding)
      a, o = first_turns(sessions, pb.session_index_b)
      first += a
      seen += o
      group.append(np.asarray(pb.group_id_b) + offset)
      offset += int(np.max(pb.group_id_b)) + 1
    cat = np.concatenate
    return critic_readout.readout(cat(values), cat(mc), cat(mask), cat(turn), first_actions_b=first,
                                  group_b=cat(group), decision_fn=L.decision_fn, value_fn=L.decision_value,
                                  boot=BOOT, seed=self.c.seed, first_observations_b=seen)

  def fit(self, pb, target_bt, seed: int) -> dict:
    """epochs x minibatches steps on one packed batch; mean fit loss and the steps taken."""
    L, v = self.learner, self.v
    b = pb.tokens_bt.shape[0]
    mb = b // v.minibatches
    full = ValueBatch(pb.tokens_bt, pb.positions_bt, np.asarray(target_bt, np.float32), pb.loss_mask_bt)
    rng = np.random.default_rng([self.c.seed, seed, 23])
    params, opt = self.params, self.opt
    mets = []
    with sharding_context(L.mesh, L.rules):
      for _ in range(v.epochs):
        perm = rng.permutation(b)
        for m in range(v.minibatches):
          idx = perm[m * mb:(m + 1) * mb]
          part = L._put(jax.tree.map(lambda x: np.asarray(x)[idx], full))
          params, opt, met = self._step(params, opt, part)
          mets.append(met)
    self._set(params, opt)
    host = jax.device_get(mets)
    return {"fit_loss": float(np.mean([m["fit_loss"] for m in host])),
            "nonfinite_steps": float(sum(m["nonfinite"] for m in host)), "steps": len(host)}


def rounds_for(v) -> int:
  """Rounds that spend the cap of `v.steps` critic steps (the last may overshoot it)."""
  per_round = max(int(v.epochs) * int(v.minibatches), 1)
  return max(-(-int(v.steps) // per_round), 1)


def readout_rounds(v) -> int:
  """Rounds of `v.tasks_per_round` tasks the final readout plays: enough for `v.readout_tasks` (0: one)."""
  return max(-(-int(v.readout_tasks) // int(v.tasks_per_round)), 1)


def _round_record(held_out: dict, stats_window: list, seed: int) -> vp_stop.RoundRecord:
  ratio, lo, hi = vp_stop.pooled_ratio(stats_window, boot=WINDOW_BOOT, seed=seed)
  own, _, _ = critic_bar.ratio_of(held_out)
  return vp_stop.RoundRecord(float(held_out["r2"]), ratio, lo, hi, own)


def _ratio_text(ratio, lo=None, hi=None) -> str:
  if ratio is None:
    return "no ratio"
  return f"{ratio:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def stage(run) -> dict:
  """Run.stage_value_pretrain: the rounds, their metrics and checkpoints (see the module doc)."""
  c, v = run.c, run.c.value_pretrain
  check_supported(c)
  L = run.learner
  pre = ValuePretrainer(L, c)
  rule = vp_stop.rule_of(v)
  start = int(run.meta["stage_step"]) if run.meta.get("stage") == "value_pretrain" else 0
  # What the stopping rule reads (vp_stop.py), kept in the checkpoint's meta: a resumed stage decides as
  # an unbroken one would.
  records = [vp_stop.RoundRecord(*r) for r in run.meta.get("vp_records", [])] if start else []
  window = [np.asarray(x) for x in run.meta.get("vp_window", [])] if start else []
  steps_done = int(run.meta.get("vp_steps", 0)) if start else 0
  spent = float(run.meta.get("vp_seconds", 0.0)) if start else 0.0
  if start == 0:
    pre.start_optimiser()
  engine = run._engine(c.rl.group_size, run._train_sampling())
  source = SyncSource(engine, seed=c.seed + 7, tasks_per_update=v.tasks_per_round,
                      share=run._share(v.tasks_per_round, "value_pretrain.tasks_per_round"))
  # Confirmation readouts of the bar taken so far, and the first round whose pooled window may stop at the
  # bar again (after one that its readout did not confirm: `window` fresh rounds later).
  attempts = int(run.meta.get("vp_readouts", 0)) if start else 0
  bar_from = int(run.meta.get("vp_bar_from", 0)) if start else 0
  total = rounds_for(v)

  say(f"value pretraining: up to {v.steps} critic steps ({total} rounds) and "
      + (f"{v.max_seconds:g} s" if v.max_seconds else "no wall-time cap") + "; stops "
      + ("at the bar, " if v.stop_at_bar else "") + (f"at ratio {v.stop_at_ratio:g}, " if v.stop_at_ratio else "")
      + (f"after {v.patience} rounds without a gain of {v.min_delta:g} in the mean held-out R^2 of "
         f"{v.window}" if v.patience else "at the cap"))
  prog = Progress("value_pretrain", total, start)
  multiple = v.minibatches
  run._sync_sampler()
  r, why, final = start - 1, None, None
  t0 = time.monotonic() - spent

  def read_critic(attempt: int, step: int) -> dict:
    """The readout of the critic as it is now, on `readout_tasks` fresh tasks: rounds total + attempt x
    readout_rounds, ... (seeds no training round and no earlier readout drew; attempt 0: the ones the
    final readout always played)."""
    batches = []
    for k in range(readout_rounds(v)):
      sessions, _ = run._everyone(*source.next_batch(total + attempt * readout_rounds(v) + k), "value_pretrain",
                                  step)
      sessions = [s for s in sessions if s.trainable]
      if sessions:
        pb = L._pack(sessions, multiple=multiple)
        batches.append((sessions, pb, np.asarray(L.critic_values(pb))))
    return pre.final_readout(batches) if batches else {}

  for r in range(start, total):
    sessions, info = run._everyone(*source.next_batch(r), "value_pretrain", r)
    sessions = [s for s in sessions if s.trainable]
    if not sessions:  # every session cut by the context cap or an env error: nothing to fit
      logging.warning("value pretraining round %d: no trainable session (context_cap %d?); skipped",
                      r, c.rollout.context_cap)
      run.writer.write(r, "value_pretrain", {**info, "value_pretrain/skipped": 1.0})
      continue
    pb = L._pack(sessions, multiple=multiple)
    values = np.asarray(L.critic_values(pb))
    held_out = pre.readout(sessions, pb, values)  # before this round's fit: held out
    window = (window + [pre.last_stats])[-int(v.window):]
    records.append(_round_record(held_out, window, c.seed * 100_003 + r))
    # Until bar_from the window may not stop at the bar (an unconfirmed stop needs `window` fresh rounds).
    active = rule if r >= bar_from else rule._replace(stop_at_bar=False)
    # A target ratio stops before this round's fit: RL gets the critic this readout scored (vp_stop.py).
    d = vp_stop.decide(records, steps_done, spent, active)
    fit = {}
    if d.reason != "ratio":
      fit = pre.fit(pb, pre.targets(pb, values), seed=r)
      steps_done += fit["steps"]
      # The slowest host's clock: every host must decide alike (one stopping alone would hang the others).
      spent = max(allgather_objects(time.monotonic() - t0))
      d = vp_stop.decide(records, steps_done, spent, active)
    last = records[-1]
    rec = {**info, **{f"value_pretrain/{k}": x for k, x in held_out.items()},
           **{f"value_pretrain/{k}": fit[k] for k in ("fit_loss", "nonfinite_steps") if k in fit},
           "value_pretrain/critic_steps": steps_done, "value_pretrain/seconds": spent,
           "value_pretrain/smoothed_r2": d.smoothed, "value_pretrain/best_r2": d.best,
           "value_pretrain/rounds_since_best": d.since}
    if last.ratio is not None:
      rec["value_pretrain/window_ratio"] = last.ratio
      if last.ratio_lo is not None:
        rec.update({"value_pretrain/window_ratio_lo": last.ratio_lo, "value_pretrain/window_ratio_hi": last.ratio_hi})
    if last.own_ratio is not None:
      rec["value_pretrain/round_ratio"] = last.own_ratio
    run.writer.write(r, "value_pretrain", rec)
    prog.update(r + 1, ev=held_out["explained_variance"], r2=held_out["r2"],
                **({"ratio": last.ratio} if last.ratio is not None else {}))
    if d.stop and d.reason == "bar":
      final = read_critic(attempts, r + 1)
      attempts += 1
      ratio, lo, hi = critic_bar.ratio_of(final)
      if critic_bar.bar_of(ratio, lo, hi) != "yes":
        window, bar_from = [], r + 1 + int(v.window)
        pooled, own = _ratio_text(last.ratio, last.ratio_lo, last.ratio_hi), _ratio_text(ratio, lo, hi)
        say(f"value pretraining: round {r}'s window read at the bar ({pooled}), the critic's own readout did not "
            f"({own} on {int(final.get('readout_sessions', 0))} sessions); fitting on, the bar checked again from "
            f"round {bar_from}")
        run.writer.write(r, "value_pretrain", {"value_pretrain/bar_unconfirmed": 1.0,
                                               **({"value_pretrain/unconfirmed_ratio": ratio} if ratio is not None
                                                  else {})})
        final = None
        d = vp_stop.decide(records, steps_done, spent, rule._replace(stop_at_bar=False))
    run.meta.update(vp_records=[list(x) for x in records], vp_window=[w.tolist() for w in window],
                    vp_steps=steps_done, vp_seconds=spent, vp_readouts=attempts, vp_bar_from=bar_from)
    if d.stop:
      why = d.reason
      break
    if (r + 1) % c.checkpoint.every == 0 and r + 1 < total:
      run.save("value_pretrain", r + 1)
  why = why or "steps"
  rounds = r + 1
  say(f"value pretraining stopped ({STOPPED[why]}) after {rounds} rounds, {steps_done} critic steps, "
      f"{spent:.0f} s")
  # The critic RL starts with, scored on fresh batches (no fitting); a stop at the bar has read it already.
  if why != "bar":
    final = read_critic(attempts, rounds)
    attempts += 1
  pre.hand_over_to_rl()
  out = {f"value_pretrain/{k}": x for k, x in final.items()}
  out.update({"value_pretrain/rounds": rounds, "value_pretrain/critic_steps": steps_done,
              "value_pretrain/seconds": spent, "value_pretrain/cap_steps": int(v.steps),
              "value_pretrain/cap_seconds": float(v.max_seconds),
              "value_pretrain/stopped_at_" + why: 1.0,
              # readouts of `readout_tasks` tasks played: the final one, and any that did not confirm the bar
              "value_pretrain/readouts": attempts})
  ratio, _, _ = critic_bar.ratio_of(final)
  if ratio is not None:
    out["value_pretrain/ev_over_oracle"] = ratio
  run.writer.write(rounds, "value_pretrain", {**out, "value_pretrain/final": 1.0})
  # Kept with the critic: an RL stage (here or in a run that takes this critic as its warm start)
  # judges it by this readout.
  run.meta["critic_readout"] = {k: float(x) for k, x in final.items() if isinstance(x, (int, float))}
  line = critic_bar.verdict(final)
  say("value pretraining: critic before RL " + ", ".join(
      f"{k.split('/', 1)[1]}={x:.3f}" for k, x in out.items() if isinstance(x, float)))
  say(f"value pretraining: {line}")
  return {**out, "critic": line}
