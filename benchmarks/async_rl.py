"""Asynchronous vs synchronous RL on a slow environment: wall-clock to equal success.

    python benchmarks/async_rl.py                      # ~5 min on a 2-core CPU (~3.5 once cached)
    python benchmarks/async_rl.py --updates 8 --etas 1 # a quick look

The `memory` probe (length 3: five turns) behind the `latency` wrapper: every
env step sleeps a lognormal delay (median 50 ms, log-sd 1, capped at 1 s),
drawn independently per session, as remote sandboxes would. A tiny policy
(2 layers, d=64) is warm-started once by behaviour cloning on demonstrations
(cached in --workdir), then each arm runs the same number of MS-GRPO updates
from that same start, with the same learner (its state is reset, so nothing
recompiles between arms):

  sync      `SyncSource`: B = T x G sessions in lockstep, every session with
            its own env thread (the best the lockstep engine can do);
  eta=k     `AsyncSource` with K actor threads, each playing one group of G
            sessions, staleness bound k, decoupled PPO.

Every `--eval_every` updates the arm snapshots its weights (clock running);
after all arms finish, the snapshots are evaluated on the same held-out tasks
(sampled at temperature 1, the policy being trained; plain memory env, clock
stopped). The target success lies `--target_frac` of the way from the warm
start to the synchronous arm's final success; an arm's "seconds" is its
training wall-clock at the first snapshot at or above the target. Async arms
count only if their final success is within `--tolerance` of the synchronous
one ("equal final success"); if none does, the seconds to finish all updates
are compared instead, and the output says so.

Prints a table, then (last line) one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import threading
import time

import jax
import numpy as np
from absl import logging

from mtrl_jax.config import base_config
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.parallel.sharded_step import init_opt_state
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams
from mtrl_jax.train.async_source import AsyncSource, copy_params
from mtrl_jax.train.evaluate import session_stats
from mtrl_jax.train.rl_step import LearnerState
from mtrl_jax.train.run import Run
from mtrl_jax.train.source import SyncSource


def bench_config(args):
  c = base_config()
  c.stages = ("demos", "sft")
  c.critic.kind = "none"
  c.env.name = "memory"
  c.env.kwargs.length = args.length
  c.env.kwargs.hint = True  # as the main job (configs/common.py): the choice matters, recall is not tested
  c.demos.episodes = 500
  c.sft.steps = args.sft_steps
  c.rl.update(estimator="ms_grpo", steps=args.updates, tasks_per_update=args.tasks, group_size=args.group,
              minibatches=2, epochs=1, lr=args.lr, warmup_steps=0, decoupled=True)
  c.rollout.update(turn_budget=8, context_cap=256)
  c.eval.update(tasks=args.eval_tasks, sampled=False, every=10_000)
  c.checkpoint.async_save = False
  c.log.tensorboard = False
  return c


def latency_factory(args):
  """Memory behind the latency wrapper, with independent delays per env instance."""
  counter, lock = itertools.count(), threading.Lock()
  kw = dict(env="memory", env_kwargs={"length": args.length, "hint": True}, median_s=args.median_s, dist=args.dist,
            sigma=args.sigma)

  def make():
    with lock:
      k = next(counter)
    return env_registry.make("latency", seed=k, **kw)

  return make


class Bench:
  """The warm-started learner and everything the arms share."""

  def __init__(self, args):
    self.args = args
    self.c = bench_config(args)
    t0 = time.perf_counter()
    # The warm start is cached per (length, SFT steps, seed): reruns skip it.
    workdir = os.path.join(args.workdir, f"memory{args.length}hint_sft{args.sft_steps}_seed{args.seed}")
    self.run = Run(self.c, workdir)
    out = self.run.run()  # SFT, or a no-op restore when the workdir has it already
    self.sft_s = time.perf_counter() - t0
    logging.info("warm start ready in %.0fs: %s", self.sft_s, out)
    self.tok, self.learner = self.run.tok, self.run.learner
    self.sft_params = copy_params(self.learner.state.policy)
    sampling = SamplingParams(temperature=1.0)
    self.sampler = self.run.sampler
    slow = latency_factory(args)
    G, T = args.group, args.tasks
    self.sync_engine = RolloutEngine(self.sampler, self.tok, slow, group_size=G, turn_token_budget=8,
                                     context_cap=256, sampling=sampling, num_env_threads=T * G, env_name="latency")
    self.actor_engine = RolloutEngine(self.sampler, self.tok, slow, group_size=G, turn_token_budget=8,
                                      context_cap=256, sampling=sampling, num_env_threads=G, env_name="latency")
    self.eval_sampler = Sampler(self.run.sampler_gd, copy_params(self.sft_params), pad_id=self.tok.pad_id,
                                stop_ids=(self.tok.eos_id,), log_compiles=False)
    self.eval_engine = RolloutEngine(self.eval_sampler, self.tok,
                                     lambda: env_registry.make("memory", length=args.length, hint=True),
                                     group_size=1,
                                     turn_token_budget=8, context_cap=256, sampling=sampling,
                                     num_env_threads=8, env_name="memory")

  def reset(self):
    L = self.learner
    p = copy_params(self.sft_params)
    L.state = LearnerState(p, init_opt_state(L.tx_policy, p, L.state_sh.opt_policy), {}, {})
    L.version = 0
    L.nonfinite_in_a_row = 0
    return L

  def evaluate(self, params) -> float:
    self.eval_sampler.set_params(params, 0)
    seeds = [1_000_000 + i for i in range(self.args.eval_tasks)]
    res = self.eval_engine.run(seeds, jax.random.key(99))
    return session_stats(res.sessions, "")["success"]


def train_arm(b: Bench, eta: int | None, updates: int, eval_every: int, actors: int) -> dict:
  """One arm; returns its timeline (seconds, weights snapshots) and rollout statistics."""
  args = b.args
  L = b.reset()
  snaps = [(0, 0.0, copy_params(b.sft_params))]
  infos, mets = [], []
  t0 = time.perf_counter()
  if eta is None:
    source = SyncSource(b.sync_engine, seed=args.seed, tasks_per_update=args.tasks)
  else:
    source = AsyncSource(b.actor_engine, params=L.policy_params_for_sampler(), version=L.version, seed=args.seed,
                         tasks_per_update=args.tasks, eta=eta, actors=actors)
  try:
    for step in range(updates):
      if eta is None:
        b.sampler.set_params(copy_params(L.policy_params_for_sampler()), L.version)
      else:
        source.publish(L.policy_params_for_sampler(), L.version)
      sessions, info = source.next_batch(step)
      mets.append(L.update(sessions, step))
      infos.append(info)
      if (step + 1) % eval_every == 0 or step + 1 == updates:
        snaps.append((step + 1, time.perf_counter() - t0, copy_params(L.policy_params_for_sampler())))
  finally:
    left = source.close()
  total = time.perf_counter() - t0
  if left:
    raise RuntimeError(f"threads did not stop: {left}")
  return {
      "eta": eta, "total_s": total, "snaps": snaps,
      "train_success": [i["rollout/success"] for i in infos],
      "idle_s": float(np.mean([i.get("learner/idle_s", 0.0) for i in infos])),
      "staleness": float(np.mean([i["staleness/mean"] for i in infos])),
      "dropped": int(infos[-1].get("queue/dropped_total", 0)),
      "utilisation": float(np.mean([i.get("actors/utilisation", np.nan) for i in infos])),
      "update_s": float(np.mean([m["update/seconds"] for m in mets])),
      "ratio_max": float(np.max([m["update/ratio_prox_behav_max"] for m in mets])),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--updates", type=int, default=24)
  parser.add_argument("--etas", type=str, default="1,2,4")
  parser.add_argument("--actors", type=int, default=16)
  parser.add_argument("--tasks", type=int, default=8, help="T tasks per update")
  parser.add_argument("--group", type=int, default=8, help="G sessions per task")
  parser.add_argument("--length", type=int, default=3, help="memory distractor turns (turns = length + 2)")
  parser.add_argument("--median_s", type=float, default=0.05)
  parser.add_argument("--sigma", type=float, default=1.0)
  parser.add_argument("--dist", type=str, default="lognormal")
  # 1e-3 (the base config's) collapsed 2 of 3 synchronous seeds to `skip` here; 5e-4 and 3e-4 learned in 3 of 3.
  parser.add_argument("--lr", type=float, default=5e-4)
  parser.add_argument("--sft_steps", type=int, default=500)
  parser.add_argument("--eval_every", type=int, default=2)
  parser.add_argument("--eval_tasks", type=int, default=128)
  parser.add_argument("--target_frac", type=float, default=0.8)
  parser.add_argument("--tolerance", type=float, default=0.05)
  parser.add_argument("--warmup", type=int, default=2, help="untimed updates per kind of arm, to compile")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", type=str, default="/tmp/mtrl_async_rl_bench")
  args = parser.parse_args()
  etas = [int(e) for e in args.etas.split(",") if e != ""]
  logging.set_verbosity(logging.WARNING)

  b = Bench(args)
  # Compile every shape (sync batch, actor batch, learner, eval) before any clock runs.
  for eta in [None] + etas[:1]:
    train_arm(b, eta, args.warmup, args.warmup, args.actors)
  b.evaluate(b.sft_params)

  arms = [train_arm(b, None, args.updates, args.eval_every, args.actors)]
  arms += [train_arm(b, e, args.updates, args.eval_every, args.actors) for e in etas]
  for arm in arms:  # clock stopped: evaluate the snapshots
    arm["evals"] = [(k, s, b.evaluate(p)) for k, s, p in arm["snaps"]]
    arm["final_success"] = arm["evals"][-1][2]
  sync, start = arms[0], arms[0]["evals"][0][2]
  # The target is --target_frac of the way from the warm start to the synchronous arm's final success, on the
  # steep part of the curve rather than on its noisy plateau (eval noise at 128 tasks is ~0.03). "Equal final
  # success" admits the async arms whose final success is within --tolerance of the synchronous one.
  target = start + args.target_frac * (sync["final_success"] - start)
  by_target = sync["final_success"] - start > args.tolerance
  for arm in arms:
    hit = next(((k, s) for k, s, succ in arm["evals"] if succ >= target), (None, None))
    arm["to_target_updates"], arm["to_target_s"] = hit if by_target else (args.updates, arm["total_s"])
    arm["equal"] = arm["final_success"] >= sync["final_success"] - args.tolerance
  fair = [a for a in arms[1:] if a["equal"] and a["to_target_s"] is not None]
  best = min(fair, key=lambda a: a["to_target_s"]) if fair else None
  if best is None:  # no async arm matched: report the fastest to finish, and say so
    by_target = False
    best = min(arms[1:], key=lambda a: a["total_s"]) if len(arms) > 1 else sync
    for arm in arms:
      arm["to_target_updates"], arm["to_target_s"] = args.updates, arm["total_s"]

  name = lambda a: "sync" if a["eta"] is None else f"eta={a['eta']}"
  fmt = lambda x, f: format(x, f) if x is not None else format("never", f[:-1].split(".")[0] + "s")
  print(f"\nasync RL benchmark: memory(length={args.length}) + latency({args.dist}, median {args.median_s * 1e3:.0f} ms, "
        f"sigma {args.sigma}); T={args.tasks} x G={args.group} sessions/update, {args.updates} updates, "
        f"K={args.actors} actors; warm start success {arms[0]['evals'][0][2]:.3f}")
  print(f"{'arm':>7} {'all s':>7} {'s/upd':>6} {'final':>6} {'to target s':>11} {'(upd)':>5} {'idle s':>6} "
        f"{'stale':>5} {'drop':>4} {'util':>5} {'upd s':>5}  eval success by update")
  for a in arms:
    curve = " ".join(f"{k}:{succ:.2f}" for k, s, succ in a["evals"])
    print(f"{name(a):>7} {a['total_s']:7.1f} {a['total_s'] / args.updates:6.2f} {a['final_success']:6.3f} "
          f"{fmt(a['to_target_s'], '11.1f')} {fmt(a['to_target_updates'], '5d')} {a['idle_s']:6.2f} {a['staleness']:5.2f} "
          f"{a['dropped']:4d} {a['utilisation']:5.2f} {a['update_s']:5.2f}  {curve}")
  for a in arms:
    print(f"{name(a):>7} training-batch success by update: " + " ".join(f"{x:.2f}" for x in a["train_success"]))
  if by_target:
    print(f"target success {target:.3f} ({args.target_frac:g} of the way from the warm start to the sync arm's "
          f"final success); 'to target s' = training wall-clock to the first eval snapshot at or above it; "
          f"async arms count if their final success is within {args.tolerance} of the sync arm's")
  else:
    print("no async arm reached the target at equal final success (or sync did not learn): "
          f"'to target s' is the time for all {args.updates} updates")
  result = {
      "benchmark": "async_rl", "date": datetime.date.today().isoformat(), "machine": platform.machine(),
      "cpus": os.cpu_count(), "updates": args.updates, "tasks": args.tasks, "group": args.group,
      "actors": args.actors, "median_s": args.median_s, "target_success": target,
      "measure": "seconds to the target eval success" if by_target else "seconds for all updates",
      "sync_seconds": round(sync["to_target_s"], 2), "async_seconds": round(best["to_target_s"], 2),
      "best_eta": best["eta"],
      "speedup": round(sync["to_target_s"] / max(best["to_target_s"], 1e-9), 3),
      "sync_success": sync["final_success"], "async_success": best["final_success"],
      "sync_total_seconds": round(sync["total_s"], 2), "async_total_seconds": round(best["total_s"], 2),
      "speedup_all_updates": round(sync["total_s"] / best["total_s"], 3),
      "per_eta": {str(a["eta"]): {"total_s": round(a["total_s"], 2), "final_success": a["final_success"],
                                  "to_target_s": None if a["to_target_s"] is None else round(a["to_target_s"], 2),
                                  "to_target_updates": a["to_target_updates"], "equal_success": a["equal"]}
                  for a in arms[1:]},
  }
  print(json.dumps(result))


if __name__ == "__main__":
  main()
