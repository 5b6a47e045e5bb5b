"""Issue 43's check: value pretraining with the defaults on `delayed(cue=True)`, then GAE vs MS-GRPO.

The probe (envs/delayed.py, `cue=True`): turn 0 picks left or right and the observation's sign says
which one pays (it differs across tasks); `horizon - 1` relay turns pay +-0.1 each, drawn per
session; the payoff comes at the end. Every cell is configs/study.py's `probe=delayed` cell with
the cue on, so the recipe is the study's (warm start: 1000 quality-0.5 demos, 600 SFT steps; RL: 32
updates of 8 tasks x 4 sessions, format penalty 0.1) and value pretraining runs at the config's
defaults (train/vp_stop.py decides when it stops). Per horizon one warm start (seed 0, shared by
the seeds, as in the study); per seed a critic warm start, then `gae_lambda0.95` (taking that
critic) and `ms_grpo`, both from it. Runs share this process's compiled programs.

  python -m experiments.critic_probe --out /tmp/critic_probe --horizons 2,8 --seeds 0,1,2
  python -m experiments.critic_probe --out /tmp/critic_probe --report   # the table from the records

Each finished step leaves a record (JSON) in OUT/records/; a relaunch skips them. The report prints
per horizon: the warm start's sampled and greedy success and how often it follows the sign
(`decision_cued`) beside the ceiling (the expert on the same eval tasks and sessions, reproducible);
per seed the critic's final readout (EV / oracle EV with its 95% interval, the rounds, critic steps,
seconds and why it stopped), the two arms' final success and their paired difference over seeds
(experiments/study/stats.py's t interval).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time

from experiments.study import stats

ARMS = ("gae_lambda0.95", "ms_grpo")
WARM_EVAL_TASKS = 256


def cell(stage: str, horizon: int, seed: int, arm: str = "ms_grpo"):
  """configs/study.py's delayed cell with the cue on; the hidden draws salted by the seed (eval draws
  differ between seeds; the shared warm start's demos keep draw_seed 0)."""
  from configs.study import get_config
  c = get_config(f"probe=delayed,horizon={horizon},stage={stage},seed={seed},arm={arm}")
  with c.unlocked():
    c.env.kwargs.cue = True
    c.env.kwargs.draw_seed = 0 if stage == "warm" else seed
  return c


def _record_path(out: str, name: str) -> str:
  return os.path.join(out, "records", f"{name}.json")


def _done(out: str, name: str):
  p = _record_path(out, name)
  return json.load(open(p)) if os.path.exists(p) else None


def _save(out: str, name: str, rec: dict) -> dict:
  os.makedirs(os.path.join(out, "records"), exist_ok=True)
  with open(_record_path(out, name), "w") as f:
    json.dump(rec, f, indent=1, sort_keys=True)
  return rec


def _run(c, workdir: str) -> tuple[dict, float, float]:
  """(summary, wall seconds, CPU seconds of this process) of one run (mtrl_jax/job.py's run_job)."""
  from mtrl_jax.job import DONE, run_job
  t, cpu = time.time(), time.process_time()
  result = run_job(c, workdir)
  if result.code != DONE:
    raise SystemExit(f"{workdir}: the job ended with exit code {result.code}: {result.error!r}")
  return result.summary, time.time() - t, time.process_time() - cpu


def ceiling(c) -> float:
  """The expert's success on the cell's eval tasks, each played as the eval plays it (session id = task
  index, the cell's draw_seed): reproducible, unlike a reset without a session id."""
  from mtrl_jax import envs
  env = envs.make(c.env.name, **dict(c.env.kwargs))
  wins = 0
  for j in range(int(c.eval.tasks)):
    env.reset(c.eval.seed_offset + j, j)
    step = None
    while not env.done:
      step = env.step(env.expert_action())
    wins += bool(step.info.get("success"))
  return wins / int(c.eval.tasks)


def warm(out: str, h: int) -> dict:
  name = f"warm,h={h}"
  if (rec := _done(out, name)) is not None:
    return rec
  c = cell("warm", h, 0)
  wd = os.path.join(out, name)
  _, secs, cpu = _run(c, wd)
  # The warm start read on the RL cells' eval tasks, sampled and greedy (eval stage only).
  e = cell("rl", h, 0)
  e.stages, e.init_from = ("eval",), wd
  e.eval.update(tasks=WARM_EVAL_TASKS, greedy=True)
  summary, _, _ = _run(e, os.path.join(out, name + ",eval"))
  keep = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("final/eval/")}
  return _save(out, name, {"horizon": h, "wall_s": secs, "cpu_s": cpu, "eval": keep, "ceiling": ceiling(e)})


def critic(out: str, h: int, seed: int) -> dict:
  name = f"critic,h={h},seed={seed}"
  if (rec := _done(out, name)) is not None:
    return rec
  c = cell("critic", h, seed)
  c.init_from = os.path.join(out, f"warm,h={h}")
  summary, secs, cpu = _run(c, os.path.join(out, name))
  vp = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("value_pretrain/")}
  return _save(out, name, {"horizon": h, "seed": seed, "wall_s": secs, "cpu_s": cpu, "value_pretrain": vp,
                           "verdict": summary.get("critic")})


def rl(out: str, h: int, seed: int, arm: str) -> dict:
  name = f"rl,h={h},seed={seed},arm={arm}"
  if (rec := _done(out, name)) is not None:
    return rec
  c = cell("rl", h, seed, arm)
  c.init_from = os.path.join(out, f"critic,h={h},seed={seed}")  # its policy is the warm start's
  summary, secs, cpu = _run(c, os.path.join(out, name))
  return _save(out, name, {"horizon": h, "seed": seed, "arm": arm, "wall_s": secs, "cpu_s": cpu,
                           "final": {k: v for k, v in summary.items() if k.startswith("final/")},
                           "critic": summary.get("critic")})


def report(out: str) -> tuple[str, dict]:
  """(the table's lines, one dict per horizon of the paired difference) from OUT/records."""
  recs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in glob.glob(os.path.join(out, "records", "*.json"))}
  lines, summary = [], {}
  for h in sorted({r["horizon"] for r in recs.values()}):
    w = recs.get(f"warm,h={h}")
    if w:
      e = w["eval"]
      lines.append(f"h={h} warm start: success sampled {e.get('eval/success', float('nan')):.3f} greedy "
                   f"{e.get('eval/greedy_success', float('nan')):.3f}; follows the sign sampled "
                   f"{e.get('eval/decision_cued', 0):.3f} greedy {e.get('eval/greedy_decision_cued', 0):.3f}; "
                   f"ceiling {w['ceiling']:.3f} ({WARM_EVAL_TASKS} tasks); {w['wall_s']:.0f} s")
    finals = {arm: {} for arm in ARMS}
    for seed in sorted({r["seed"] for r in recs.values() if r.get("horizon") == h and "seed" in r}):
      cr = recs.get(f"critic,h={h},seed={seed}")
      if cr:
        v = cr["value_pretrain"]
        why = next((k[len("stopped_at_"):] for k in v if k.startswith("stopped_at_")), "?")
        lines.append(f"h={h} seed={seed} critic: EV {v.get('explained_variance', float('nan')):.3f} / oracle "
                     f"{v.get('oracle_explained_variance', float('nan')):.3f} = {v.get('ev_over_oracle', float('nan')):.2f} "
                     f"[{v.get('ev_over_oracle_lo', float('nan')):.2f}, {v.get('ev_over_oracle_hi', float('nan')):.2f}]; "
                     f"{v.get('rounds')} rounds, {v.get('critic_steps')} steps, {cr['wall_s']:.0f} s wall, "
                     f"{cr['cpu_s']:.0f} s CPU; stopped: {why}")
      for arm in ARMS:
        r = recs.get(f"rl,h={h},seed={seed},arm={arm}")
        if r:
          finals[arm][seed] = r["final"].get("final/eval/success")
          cued = r["final"].get("final/eval/decision_cued", float("nan"))
          lines.append(f"h={h} seed={seed} {arm}: final success {finals[arm][seed]:.3f}, follows the sign "
                       f"{cued:.3f} ({r['wall_s']:.0f} s)")
    seeds, d = stats.paired(finals[ARMS[0]], finals[ARMS[1]])
    t = stats.paired_test(d)
    if t is not None:
      ok = t.hi >= 0
      summary[f"h{h}"] = {"seeds": list(seeds), "diff_mean": t.mean, "diff_lo": t.lo, "diff_hi": t.hi,
                          "not_below": bool(ok)}
      lines.append(f"h={h} {ARMS[0]} - {ARMS[1]} over seeds {seeds}: {t.mean:+.3f} [{t.lo:+.3f}, {t.hi:+.3f}] "
                   f"(diffs {', '.join(f'{x:+.3f}' for x in d)}): "
                   + ("not below by more than the interval" if ok else "BELOW by more than the interval"))
  return "\n".join(lines), summary


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--horizons", default="2,8")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--stages", default="warm,critic,rl", help="which steps to run (comma-separated)")
  p.add_argument("--report", action="store_true", help="only print the table from OUT/records")
  a = p.parse_args(argv)
  if not a.report:
    horizons = [int(x) for x in a.horizons.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    todo = a.stages.split(",")
    for h in horizons:
      if "warm" in todo:
        warm(a.out, h)
      for seed in seeds:
        if "critic" in todo:
          critic(a.out, h, seed)
        if "rl" in todo:
          for arm in ARMS:
            rl(a.out, h, seed, arm)
        print(report(a.out)[0], flush=True)
  text, summary = report(a.out)
  print(text)
  print(json.dumps({"critic_probe": summary}))


if __name__ == "__main__":
  main()
