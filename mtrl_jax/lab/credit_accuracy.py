"""The credit-accuracy lab: every advantage estimator against ground truth.

    python -m mtrl_jax.lab.credit_accuracy --config=configs/lab.py --workdir=/tmp/lab

For a fixed policy, the true advantage of the action a_t taken at turn t of
a session is A*(h_t, a_t) = Q(h_t, a_t) - V(h_t). The lab forks the session
at every turn (env clone + KV-cache rows) and plays K continuations:
V(h_t) is the mean return from turn t on when the action at t is resampled;
Q(h_t, a_t) = r_t + V(h_{t+1}) continues after a_t (the env is
deterministic given its state, so the continuations from h_{t+1} are the
continuations after a_t; V = 0 after the last turn). Standard errors follow
from the K returns. Then every estimator (mtrl_jax/lab/variants.py) is
applied to the same N sessions, with the critic fitted the way the trainer
does (value pretraining) and a progress head fitted on other sessions of
the same policy, and scored per distance to the final reward
(mtrl_jax/lab/scores.py); where the env lets the policy stop early
(`info["early_exit"]`), also on the stop and the carry-on decisions apart. Every agreement
fraction comes with its item count and 95% Wilson interval (scores.py); every row that reads
a critic carries that critic's bar (lab/critic_bar.py: below 0.8 x the oracle's EV the row is
"critic below the bar: not tested"). Output: a table, `<workdir>/lab/agreement.png`,
`<workdir>/lab/result.json`, and the JSON object as the last line.

Nothing in train/ imports this package; credit/ stays pure.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from mtrl_jax.credit import registry as credit_registry
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.lab import critic_bar, plan_split, scores
from mtrl_jax.lab.continuations import Start, continue_from
from mtrl_jax.lab.variants import lab_estimators
from mtrl_jax.metrics import Progress, say
from mtrl_jax.models.chat import HistoryTurn
from mtrl_jax.parallel.sharded_step import sharding_context
from mtrl_jax.rollout.session import Session
from mtrl_jax.train import progress as progress_head

_CONFIG = config_flags.DEFINE_config_file("config", None, "Lab config (configs/lab.py[:args]).", lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir: its checkpoint is the policy (and critic).")


# ------------------------------------------------------------------ ground truth
def histories(sessions: list[Session], env_factory) -> list[Start]:
  """One start per (session, turn): the env replayed to turn t, the tokens through obs_t."""
  starts = []
  for s in sessions:
    env = env_factory()
    env.reset(s.seed, s.session_id)  # the session's own draws, where the env draws per session
    prefix: list[int] = []
    done: list[HistoryTurn] = []
    for t, turn in enumerate(s.turns):
      obs_ids = tuple(int(x) for x in turn.obs_ids)
      prefix = prefix + list(obs_ids)
      starts.append(Start(env.clone(), list(prefix), t, s.prompt, tuple(done), turn.observation, obs_ids))
      act_ids = tuple(int(x) for x in turn.action_ids)
      prefix = prefix + list(act_ids)
      done.append(HistoryTurn(turn.observation, obs_ids, act_ids))
      env.step(turn.action)
  return starts


def ground_truth(sessions, v_sk: np.ndarray) -> tuple[list, list]:
  """Per session: A*_t = r_t + V(h_{t+1}) - V(h_t) and its standard error."""
  k = v_sk.shape[1]
  mean = v_sk.mean(1)
  se = v_sk.std(1, ddof=1) / np.sqrt(k) if k > 1 else np.full(len(mean), np.inf)
  a_star, a_se, i = [], [], 0
  for s in sessions:
    n = s.num_turns
    v = np.append(mean[i:i + n], 0.0)
    e = np.append(se[i:i + n], 0.0)
    r = np.array([t.reward for t in s.turns])
    a_star.append(r + v[1:] - v[:-1])
    a_se.append(np.sqrt(e[1:] ** 2 + e[:-1] ** 2))
    i += n
  return a_star, a_se


# ------------------------------------------------------------------ estimators
def _credit_batch(pb, values_bt, progress_bt=None) -> CreditBatch:
  return CreditBatch(reward_bt=jnp.asarray(pb.reward_bt), loss_mask_bt=jnp.asarray(pb.loss_mask_bt),
                     turn_idx_bt=jnp.asarray(pb.turn_idx_bt), group_id_b=jnp.asarray(pb.group_id_b),
                     episode_id_b=jnp.asarray(pb.episode_id_b), tree_id_b=jnp.asarray(pb.tree_id_b),
                     return_b=jnp.asarray(pb.return_b),
                     value_bt=None if values_bt is None else jnp.asarray(values_bt, jnp.float32),
                     state_id_bt=None if pb.state_id_bt is None else jnp.asarray(pb.state_id_bt),
                     turn_reward_bt=None if pb.turn_reward_bt is None else jnp.asarray(pb.turn_reward_bt),
                     progress_bt=None if progress_bt is None else jnp.asarray(progress_bt, jnp.float32))


def per_turn(adv_bt, pb, n_sessions: int, num_turns: list[int]) -> list[np.ndarray]:
  """Each session's advantage per turn: the mean over the turn's action tokens."""
  adv_bt, m_bt, t_bt = np.asarray(adv_bt), pb.loss_mask_bt > 0, pb.turn_idx_bt
  out = []
  for i in range(n_sessions):
    a = np.zeros(num_turns[i])
    for t in range(num_turns[i]):
      sel = m_bt[i] & (t_bt[i] == t)
      a[t] = adv_bt[i][sel].mean() if sel.any() else 0.0
    out.append(a)
  return out


def session_values(learner, sessions) -> list[np.ndarray]:
  """The critic's value at every token of each session (left-aligned rows)."""
  pb = learner._pack(sessions)
  _, _, values = learner.score(pb)
  values = np.asarray(values)
  return [values[i, :len(s.flat_tokens())] for i, s in enumerate(sessions)]


# Session resamples of the critic readout's intervals (train/value_pretrain.py's BOOT; milliseconds here).
CRITIC_BOOT = 2000
_QUALITY_KEYS = ("explained_variance", "oracle_explained_variance", "decision_gap", "oracle_decision_gap",
                 "explained_variance_lo", "explained_variance_hi", "oracle_explained_variance_lo",
                 "oracle_explained_variance_hi", "ev_over_oracle_lo", "ev_over_oracle_hi")


def critic_quality(learner, sessions, boot: int = CRITIC_BOOT, seed: int = 0) -> dict:
  """The learner's critic on the lab's sessions (held out: no critic ever fitted on them): explained
  variance of their Monte-Carlo returns and, on probes with known values, the oracle critic's, with
  95% session-bootstrap intervals of both and of their ratio (critic_readout.ev_intervals: the
  critic bar's input, lab/critic_bar.py). A NaN end (a degenerate bootstrap) is None."""
  pb = learner._pack(sessions)
  _, _, values = learner.score(pb)
  r = learner.critic_readout(sessions, pb, np.asarray(values), boot=boot, seed=seed)
  out = {k: _num(r[k]) for k in _QUALITY_KEYS if k in r}
  if "readout_sessions" in r:
    out["readout_sessions"] = int(r["readout_sessions"])
  return out


def apply_estimators(table, sessions, values: dict, learner) -> dict:
  """name -> per-session per-turn advantages on `sessions` (values: critic -> per-session arrays)."""
  pb = learner._pack(sessions)
  b, t = pb.tokens_bt.shape
  out = {}
  for name, (reg, hp, critic) in table.items():
    v_bt = None
    if critic is not None:
      v_bt = np.zeros((b, t), np.float32)
      for i, v in enumerate(values[critic]):
        v_bt[i, :len(v)] = v
    batch = _credit_batch(pb, None, v_bt) if critic == "progress" else _credit_batch(pb, v_bt)
    adv, _ = credit_registry.compute_advantages(reg, batch, **hp)
    out[name] = per_turn(adv, pb, len(sessions), [s.num_turns for s in sessions])
  return out


def fit_progress_head(run, fit_sessions, steps: int) -> tuple[progress_head.ProgressTrainer, dict]:
  """A progress head (train/progress.py) fitted on `fit_sessions` of the policy, from its trunk.

  A quarter of the groups is held out: the head trains on the rest for up to
  `steps` steps and keeps the parameters with the lowest held-out loss (it
  memorises the training sessions' returns otherwise).
  """
  L = run.learner
  trainer = progress_head.ProgressTrainer(steps, run.c.progress.lr, seed=run.c.seed)
  trainer.init_from_policy(L.policy_gd, L.state.policy)
  groups = sorted({s.group_id for s in fit_sessions})
  held = set(groups[::4])
  train = [s for s in fit_sessions if s.group_id not in held]
  val = [s for s in fit_sessions if s.group_id in held]
  with sharding_context(L.mesh, L.rules):
    fit = trainer.fit_early_stopping(L._put(progress_head.arrays(L._pack(train))),
                                     L._put(progress_head.arrays(L._pack(val))), int(steps))
  ret = np.array([s.episode_return for s in val])
  return trainer, {"fit_sessions": len(train), "held_out_sessions": len(val), "max_steps": int(steps),
                   **{k: v if isinstance(v, int) else round(float(v), 5) for k, v in fit.items()},
                   "held_out_return_var": round(float(np.var(ret)), 5)}


def session_shares(run, trainer, sessions) -> tuple[list[np.ndarray], float]:
  """Each session's per-turn shares (left-aligned rows, on the turns' last action tokens)
  and the held-out fit: 1 - mean (sum of shares - R)^2 / Var(R) over `sessions`."""
  L = run.learner
  pb = L._pack(sessions)
  with sharding_context(L.mesh, L.rules):
    share = trainer.shares(L._put(progress_head.arrays(pb)))
  out = [share[i, :len(s.flat_tokens())] for i, s in enumerate(sessions)]
  ret = np.array([s.episode_return for s in sessions])
  gap = np.array([o.sum() for o in out]) - ret
  var = float(np.var(ret))
  return out, (1.0 - float(np.mean(gap ** 2)) / var) if var > 0 else float("nan")


def split_scores(est_i, a_star_i, se_i, exit_i) -> dict:
  """Sign agreement (significant items: their count and Wilson interval) and normalised
  bias on the stop decisions (`exit_i`) and on the others apart, on the whole batch's scales."""
  rms_e, rms_a = scores._rms(est_i), scores._rms(a_star_i)
  out = {}
  for label, m in (("exit", exit_i), ("carry_on", ~exit_i)):
    a = scores.sign_agreement(est_i, a_star_i, se_i, m)
    out[f"agreement_{label}"] = a["agreement"]
    out[f"significant_{label}"] = a["items"]
    out[f"agreement_{label}_wilson95"] = a["wilson95"]
    out[f"bias_{label}"] = float(np.mean(est_i[m] / rms_e - a_star_i[m] / rms_a)) if m.any() else None
    out[f"mean_estimate_{label}"] = float(np.mean(est_i[m] / rms_e)) if m.any() else None
    out[f"mean_a_star_{label}"] = float(np.mean(a_star_i[m] / rms_a)) if m.any() else None
  return out


def bootstrap(sessions, rng: np.random.Generator) -> list[int]:
  """Indices of a resampled batch: each group's members drawn with replacement."""
  groups: dict[int, list[int]] = {}
  for i, s in enumerate(sessions):
    groups.setdefault(s.group_id, []).append(i)
  return [int(j) for members in groups.values() for j in rng.choice(members, len(members))]


def fit_coupled_critic(run, rounds: int) -> None:
  """Value pretraining continued for `rounds` rounds on lambda = 0.95 (bootstrapped) targets."""
  L = run.learner
  L.set_estimator("gae", {"lambda_policy": 0.95, "lambda_critic": 0.95})
  v = run.c.value_pretrain
  v.targets = "estimator"
  v.steps = rounds * v.epochs * v.minibatches
  v.patience, v.stop_at_bar, v.stop_at_ratio, v.max_seconds = 0, False, 0.0, 0.0  # exactly `rounds` rounds
  run.meta.update(stage=None, stage_step=0, vp_records=[], vp_window=[], vp_steps=0, vp_seconds=0.0)
  run.save = lambda *args, **kw: None  # this critic is the lab's own: never into the workdir's checkpoint
  run.stage_value_pretrain()


# ------------------------------------------------------------------ report
def _num(x: float):
  """Rounded, and None for NaN (the JSON line must stay valid JSON)."""
  return None if not np.isfinite(x) else round(float(x), 4)


def _ci(ci):
  return None if ci is None else [round(float(x), 4) for x in ci]


def score_estimator(est_i, a_star_i, se_i, dist_i, max_dist: int, resample_ri, exit_i) -> dict:
  """One estimator's entry of result.json: sign agreement on the significant items overall and by
  distance, each with its item count and 95% Wilson interval; rank correlation, bias, variance; the
  early-exit split where the batch has stops."""
  overall = scores.sign_agreement(est_i, a_star_i, se_i)
  per = scores.by_distance(est_i, a_star_i, se_i, dist_i, max_dist)
  out = {"agreement": {**overall, "agreement": _num(overall["agreement"]) if overall["items"] else None,
                       "wilson95": _ci(overall["wilson95"])},
         "agreement_by_distance": [None if r["agreement"] is None else round(r["agreement"], 4) for r in per],
         "agreement_by_distance_items": [r["items"] for r in per],
         "agreement_by_distance_wilson95": [_ci(r["wilson95"]) for r in per],
         "rank_corr": _num(scores.rank_corr(est_i, a_star_i)),
         "bias": _num(scores.normalised_bias(est_i, a_star_i)),
         "variance": _num(scores.resample_variance(resample_ri, est_i))}
  if exit_i.any():
    out["early_exit"] = {k: v if v is None or isinstance(v, (int, list)) else _num(v)
                         for k, v in split_scores(est_i, a_star_i, se_i, exit_i).items()}
    for k in ("agreement_exit_wilson95", "agreement_carry_on_wilson95"):
      out["early_exit"][k] = _ci(out["early_exit"][k])
  return out


def mark_critic_rows(result: dict, table: dict, critics: dict) -> None:
  """Each row that reads a critic ('mc', 'coupled') gets the critic's name, its bar
  (critic_bar.judge, also kept in result['critics']) and the bar's verdict (None: a fair test)."""
  for quality in critics.values():
    quality["critic_bar"] = critic_bar.judge(quality)
  for name, (_, _, critic) in table.items():
    if critic in critics and name in result["estimators"]:
      r = result["estimators"][name]
      r["critic"] = critic
      r["critic_bar"] = critics[critic]["critic_bar"]
      r["verdict"] = r["critic_bar"]["verdict"]


def _cell(frac, ci) -> str:
  return "-" if frac is None else f"{frac:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def table_lines(result: dict) -> list[str]:
  """The printed table: sign agreement overall and per distance (95% Wilson interval in brackets,
  item counts in the header), rank corr, bias, variance, the critic's EV and EV / oracle EV with
  their intervals and bar; a row whose critic is below the bar says so in its name cell."""
  counts, critics = result["significant_by_distance"], result.get("critics", {})
  n_all = sum(counts)
  head = " | ".join(f"d={d} (n={n})" for d, n in enumerate(counts))
  lines = [f"| estimator | all (n={n_all}) | {head} | rank corr | bias | variance | critic EV [95%] | "
           "oracle EV | EV / oracle [95%], bar |",
           "|---|" + "---:|" * (len(counts) + 7)]
  fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
  for name, r in result["estimators"].items():
    a = r["agreement"]
    cells = " | ".join(_cell(f, ci) for f, ci in zip(r["agreement_by_distance"], r["agreement_by_distance_wilson95"]))
    cq = critics.get(r.get("critic"), {})
    ev = fmt(cq.get("explained_variance"), ".3f")
    if cq.get("explained_variance_lo") is not None and cq.get("explained_variance_hi") is not None:
      ev += f" [{cq['explained_variance_lo']:.2f}, {cq['explained_variance_hi']:.2f}]"
    label = name if not r.get("verdict") else f"{name} ({r['verdict']})"
    bar = critic_bar.said(r["critic_bar"]) if "critic_bar" in r else "-"
    lines.append(f"| {label} | {_cell(a['agreement'], a['wilson95'])} | {cells} | {fmt(r['rank_corr'], '.3f')} | "
                 f"{fmt(r['bias'], '+.3f')} | {fmt(r['variance'], '.3f')} | {ev} | "
                 f"{fmt(cq.get('oracle_explained_variance'), '.3f')} | {bar} |")
  return lines


def exit_table_lines(result: dict) -> list[str]:
  """The early-exit table: agreement on the stops and on the other actions (95% Wilson interval;
  the item counts in the head), the biases and the mean estimate and A* of the stops."""
  rows = result["estimators"]
  first = next(iter(rows.values()))["early_exit"]
  fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
  lines = [f"| estimator | agreement stop (n={first['significant_exit']}) | agreement carry on "
           f"(n={first['significant_carry_on']}) | bias stop | bias carry on | mean est. stop | mean A* stop |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, r in rows.items():
    e = r["early_exit"]
    label = name if not r.get("verdict") else f"{name} ({r['verdict']})"
    lines.append(f"| {label} | {_cell(e['agreement_exit'], e['agreement_exit_wilson95'])} | "
                 f"{_cell(e['agreement_carry_on'], e['agreement_carry_on_wilson95'])} | "
                 f"{fmt(e['bias_exit'], '+.3f')} | {fmt(e['bias_carry_on'], '+.3f')} | "
                 f"{fmt(e['mean_estimate_exit'], '+.3f')} | {fmt(e['mean_a_star_exit'], '+.3f')} |")
  return lines


def plot_points(agreement_by_distance: list) -> tuple[list, list]:
  """The (distance, agreement) points of one line: distances without significant
  items (None) are left out, so the line joins its neighbours across them (with
  NaN gaps an entry between two empty distances would be an unjoined dot)."""
  xy = [(d, y) for d, y in enumerate(agreement_by_distance) if y is not None]
  return [d for d, _ in xy], [y for _, y in xy]


def error_bars(agreement_by_distance: list, wilson95: list) -> list[list]:
  """[below, above] distances from each plotted point (plot_points' order) to its
  Wilson interval's ends: matplotlib's asymmetric yerr."""
  ends = [(y, ci) for y, ci in zip(agreement_by_distance, wilson95) if y is not None]
  return [[y - ci[0] for y, ci in ends], [ci[1] - y for y, ci in ends]]


def plot(path: str, result: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 5))
  rows = result["estimators"]
  for j, (name, r) in enumerate(rows.items()):
    xs, ys = plot_points(r["agreement_by_distance"])
    untested = r.get("critic_bar", {}).get("tested") is False  # not a fair test: drawn faint, said in the legend
    label = name + (f" ({r['verdict']})" if untested else "")
    style = dict(marker="o", label=label, linestyle="--" if "gae" not in name else "-",
                 alpha=0.3 if untested else 1.0)
    wilson = r.get("agreement_by_distance_wilson95")
    if wilson is None:  # a result.json from before the intervals
      ax.plot(xs, ys, **style)
      continue
    # Rows side by side within a distance, so equal rows' bars do not hide each other.
    dx = 0.5 * (j - (len(rows) - 1) / 2) / max(len(rows), 1)
    ax.errorbar([x + dx for x in xs], ys, yerr=error_bars(r["agreement_by_distance"], wilson), capsize=2,
                elinewidth=0.8, markersize=4, **style)
  counts = result.get("significant_by_distance")
  if counts:  # how many items each column rests on, under its tick
    ax.set_xticks(range(len(counts)), [f"{d}\nn={n}" for d, n in enumerate(counts)])
  ax.set_xlabel("turns before the final reward (0 = the last turn); n = items with |A*| > 2 s.e.")
  ax.set_ylabel("sign agreement with A* (|A*| > 2 s.e.), 95% Wilson interval")
  ax.set_title(f"{result['env']}: N={result['sessions']} sessions, K={result['continuations']} continuations")
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  from mtrl_jax.job import run_job
  c, workdir = _CONFIG.value, _WORKDIR.value
  if c is None or workdir is None:
    raise app.UsageError("--config and --workdir are required")
  lab = c.lab
  t0 = time.time()
  # The run's stages (warm start + value pretraining, or the checkpoint already in workdir), as the
  # main job runs them: compile cache, logging and exit codes from mtrl_jax/job.py.
  job = run_job(c, workdir, log_level=None if flags.FLAGS["verbosity"].present else logging.WARNING)
  if job.code:
    sys.exit(job.code)
  run = job.run
  setup_s = time.time() - t0
  table = lab_estimators(tuple(lab.estimators) or None)
  has_critic = c.critic.kind != "none"
  if not has_critic:
    table = {n: e for n, e in table.items() if e[2] in (None, "progress")}

  # 1. N sessions of the policy.
  run._sync_sampler()
  engine = run._engine(c.rl.group_size, run._train_sampling())
  seeds = [lab.seed_offset + i for i in range(lab.tasks)]
  res = engine.run(seeds, jax.random.key(c.seed + 321))
  sessions = [s for s in res.sessions if s.trainable]
  say(f"lab: {len(sessions)} sessions, success {np.mean([s.success for s in sessions]):.3f}, "
      f"{res.ledger.generated_total + res.ledger.prefilled_total} tokens")
  fit = []
  if any(e[2] == "progress" for e in table.values()):
    # The progress head's training sessions: the same policy on the task seeds after the lab's own
    # (played now, while the sampler holds the policy: the critic fits below update the learner).
    fit_seeds = [lab.seed_offset + lab.tasks + i for i in range(int(lab.progress_tasks))]
    fit = [s for s in engine.run(fit_seeds, jax.random.key(c.seed + 432)).sessions if s.trainable]

  # 2. Ground truth by continuations from every turn.
  t1 = time.time()
  env_factory = run._env_factory()
  starts = histories(sessions, env_factory)
  cont = continue_from(run.sampler, run.tok, starts, int(lab.continuations), turn_budget=c.rollout.turn_budget,
                       context_cap=c.rollout.context_cap, sampling=run._train_sampling(),
                       rng=jax.random.key(c.seed + 654), rows_per_call=int(lab.rows_per_call),
                       progress=Progress("ground truth", len(starts)).update,
                       fork_randomness=str(lab.fork_randomness))
  a_star, a_se = ground_truth(sessions, cont.returns_sk)
  gt_s = time.time() - t1
  say(f"lab: ground truth from {len(starts)} histories x {lab.continuations} continuations in {gt_s:.0f}s "
      f"({cont.tokens_generated + cont.tokens_prefilled} tokens)")

  # 3. Critics: the value-pretrained one, and (optionally) one refitted on lambda = 0.95 targets.
  values, critics = {}, {}
  if has_critic:
    values["mc"] = session_values(run.learner, sessions)
    critics["mc"] = critic_quality(run.learner, sessions, seed=c.seed)
    say(f"lab: critic (value pretraining) on the lab's sessions: {critics['mc']}")
    if lab.coupled_critic_rounds > 0 and any(e[2] == "coupled" for e in table.values()):
      saved = jax.tree.map(jnp.copy, run.learner.state.critic)
      fit_coupled_critic(run, int(lab.coupled_critic_rounds))
      values["coupled"] = session_values(run.learner, sessions)
      critics["coupled"] = critic_quality(run.learner, sessions, seed=c.seed)
      say(f"lab: coupled critic (lambda 0.95 targets) on the lab's sessions: {critics['coupled']}")
      run.learner.state = run.learner.state._replace(critic=saved)
    else:
      table = {n: e for n, e in table.items() if e[2] != "coupled"}
  progress_info = None
  if any(e[2] == "progress" for e in table.values()):
    # The head learns from other sessions of the same policy (task seeds after the lab's own),
    # then gives its shares of the lab's sessions: held out, as the critic's values are.
    t2 = time.time()
    trainer, progress_info = fit_progress_head(run, fit, int(lab.progress_steps))
    values["progress"], progress_info["held_out_explained_variance"] = session_shares(run, trainer, sessions)
    progress_info["seconds"] = round(time.time() - t2, 1)
    say(f"lab: progress head fitted on {progress_info['fit_sessions']} sessions (best of "
        f"{progress_info['steps_run']} steps at {progress_info['best_step']}: held-out loss "
        f"{progress_info['held_out_loss']:.4f} vs Var(R) {progress_info['held_out_return_var']:.4f}, train loss "
        f"{progress_info['train_loss']:.4f}); explained variance of the summed shares on the lab's sessions "
        f"{progress_info['held_out_explained_variance']:.3f}")

  # 4. Every estimator on the same sessions, and on bootstrap resamples.
  adv = apply_estimators(table, sessions, values, run.learner)
  rng = np.random.default_rng(c.seed + 987)
  n_items = sum(s.num_turns for s in sessions)
  offsets = np.cumsum([0] + [s.num_turns for s in sessions])
  resampled = {name: np.full((int(lab.resamples), n_items), np.nan) for name in table}
  for r in range(int(lab.resamples)):
    idx = bootstrap(sessions, rng)
    copies = [dataclasses.replace(sessions[j], session_id=10**9 + k) for k, j in enumerate(idx)]
    vals = {name: [v[j] for j in idx] for name, v in values.items()}
    out = apply_estimators(table, copies, vals, run.learner)
    for name, per in out.items():
      seen = set()
      for k, j in enumerate(idx):
        if j in seen:  # one draw per original item and resample
          continue
        seen.add(j)
        resampled[name][r, offsets[j]:offsets[j + 1]] = per[k]

  # 5. Scores.
  a_i, se_i = np.concatenate(a_star), np.concatenate(a_se)
  dist_i = np.concatenate([np.arange(s.num_turns)[::-1] for s in sessions])
  max_d = int(dist_i.max())
  exit_i = np.concatenate([[bool(t.info.get("early_exit", False)) for t in s.turns] for s in sessions])
  result = {"env": c.env.name, "sessions": len(sessions), "continuations": int(lab.continuations),
            "fork_randomness": str(lab.fork_randomness),
            "env_crn": bool(dict(c.env.kwargs).get("crn", False)),
            "agreement_interval": "wilson95: 95% Wilson score interval (no continuity correction) of the "
                                  "agreement over its items (mtrl_jax/lab/scores.py)",
            "critic_bar": critic_bar.CRITIC_BAR, "estimators": {}}
  for name in table:
    result["estimators"][name] = score_estimator(np.concatenate(adv[name]), a_i, se_i, dist_i, max_d,
                                                 resampled[name], exit_i)
  plan_i = plan_split.plan_mask(sessions)  # the walkthrough's turns, where the env marks them
  if plan_i is not None:
    for name in table:
      result["estimators"][name]["walkthrough"] = plan_split.plan_scores(np.concatenate(adv[name]), a_i, se_i, plan_i)
  mark_critic_rows(result, table, critics)  # the critic each estimator's advantages read, and its bar
  if critics:
    result["critics"] = critics
  if progress_info is not None:
    result["progress_head"] = progress_info
  if any(e[0] in ("gigpo", "hgpo") for e in table.values()):
    from mtrl_jax.credit.step_groups import step_group_stats
    pb = run.learner._pack(sessions)
    result["step_groups"] = {k: int(v) for k, v in step_group_stats(_credit_batch(pb, None)).items()}
  sig = scores.significant(a_i, se_i)
  result["significant_by_distance"] = [int((sig & (dist_i == d)).sum()) for d in range(max_d + 1)]
  counts = result["significant_by_distance"]
  result["a_star_mean_abs_by_distance"] = [round(float(np.abs(a_i[dist_i == d]).mean()), 4) for d in range(max_d + 1)]
  result["a_star_se_mean"] = round(float(se_i.mean()), 4)
  result["tokens"] = {"sessions": int(res.ledger.generated_total + res.ledger.prefilled_total),
                      "continuations": int(cont.tokens_generated + cont.tokens_prefilled)}
  result["success"] = float(np.mean([s.success for s in sessions]))
  result["seconds"] = {"setup": round(setup_s, 1), "ground_truth": round(gt_s, 1),
                       "total": round(time.time() - t0, 1)}

  out_dir = os.path.join(workdir, "lab")
  os.makedirs(out_dir, exist_ok=True)
  plot(os.path.join(out_dir, "agreement.png"), result)
  with open(os.path.join(out_dir, "result.json"), "w") as f:
    json.dump(result, f, indent=1)

  print(f"\n{c.env.name} {dict(c.env.kwargs)}: {len(sessions)} sessions (success {result['success']:.3f}), "
        f"K={lab.continuations}, forks' env randomness {result['fork_randomness']}"
        f"{', env crn' if result['env_crn'] else ''}; {int(sig.sum())}/{len(a_i)} turn actions with |A*| > 2 s.e. "
        f"(by distance 0..{max_d}: {counts}); mean s.e. {se_i.mean():.3f}")
  print(f"{platform.machine()} {os.cpu_count()} cores, load {tuple(round(x, 1) for x in os.getloadavg())}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; seconds {result['seconds']}; "
        f"tokens {result['tokens']}")
  print("\nSign agreement on the significant items [95% Wilson interval]; critic bar: EV >= "
        f"{critic_bar.CRITIC_BAR} x the oracle's, judged on the ratio's 95% session-bootstrap interval")
  print("\n".join(table_lines(result)))
  if exit_i.any():
    n_stop = int((exit_i & sig).sum())
    print(f"\nEarly exits: {int(exit_i.sum())} stop decisions ({n_stop} significant), "
          f"{int((~exit_i).sum())} others ({int((~exit_i & sig).sum())} significant)")
    print("\n" + "\n".join(exit_table_lines(result)))
  if plan_i is not None:
    print(f"\nWalkthrough turns (the planned command at its state): {int(plan_i.sum())} of {len(plan_i)}")
    print("\n" + "\n".join(plan_split.plan_table_lines(result)))
  if "step_groups" in result:
    g = result["step_groups"]
    print(f"\nStep groups (gigpo): {g['grouped']} of {g['turns']} turns share their anchor state with another "
          f"session of their task ({g['keyed']} have a state key)")
  print(json.dumps({k: result[k] for k in ("env", "sessions", "continuations", "estimators")}))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
