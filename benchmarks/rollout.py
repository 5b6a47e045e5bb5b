"""Rollout throughput: the lockstep engine vs continuous batching, and the
prefill one prefill per group saves.

    flock /tmp/mtrl_heavy.lock python benchmarks/rollout.py          # the recorded run (~3 min on 2 CPU cores)
    python benchmarks/rollout.py --tasks 4 --group 2 --rows 4 --reps 1 --dim 64 --layers 2  # a smoke run

Workload: `--tasks` tasks x `--group` sessions of a chatty env with
`--min_turns`..`--max_turns` turns (by seed). Every env step sleeps a
log-normal delay with mean `--latency_ms` (log-sd `--latency_sigma`), drawn
per session and turn, as a remote sandbox would answer. The policy is a
random byte-level decoder; `--stops` of its 264 ids end an action, so with
its near-uniform next-token distribution an action stops after a geometric
number of tokens (mean ~264 / stops), cut at `--budget`: action lengths
range from a few tokens to the budget (the measured spread is printed). The
prompt (`--prompt_chars`) and first observation are the same for a group's
sessions.

Arms, on the same tasks and sampling keys (so the same sessions):
  lockstep     `RolloutEngine`: every session is a row; each turn decodes
               until the longest action stops, then waits for the slowest env.
  continuous   `ContinuousEngine` with `--rows` decode rows, every session of
               the run in flight, `--chunk` steps per decode call.
  +group       continuous with one prefill per group.
Each arm runs once to compile, then `--reps` times; the median wall time
counts. Sessions/s = sessions / wall time; decode slot utilisation =
generated tokens / (rows x decode steps) (`TokenLedger.slot_utilisation`);
prefill saved = tokens copied from a group sibling / tokens the unshared run
prefills.

Prints a table, then (last line) one JSON object with `sessions_per_s_ratio`
(continuous / lockstep), `slot_util_lockstep`, `slot_util_continuous` and
`prefill_saved_frac`.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import random
import statistics
import threading
import time

import jax
import numpy as np
from flax import nnx

from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

TOK = ByteTokenizer()
WORDS = ("lamp", "river", "stone", "cloud", "ember", "maple", "orbit", "quill", "tiger", "vapor")
_counter = itertools.count()
_lock = threading.Lock()


class ChatterEnv(Env):
  """Says something short each turn, accepts any action, ends after its turns;
  each step sleeps a log-normal delay (mean `latency_s`)."""

  def __init__(self, min_turns: int, max_turns: int, prompt_chars: int, latency_s: float, sigma: float):
    self.min_turns, self.max_turns = min_turns, max_turns
    self.prompt_chars, self.latency_s, self.sigma = prompt_chars, latency_s, sigma
    with _lock:
      self.delays = random.Random(next(_counter))  # per session: groups' sessions differ
    self.name = "chatter"

  def _reset(self, seed):
    self.turns = self.min_turns + seed % (self.max_turns - self.min_turns + 1)
    text = ("You are talking to a patient listener. Answer each line in your own words, then stop. " * 8)
    return Reset(text[:self.prompt_chars], f"first: tell me about the {WORDS[seed % len(WORDS)]}")

  def _step(self, action):
    if self.latency_s > 0:
      mu = math.log(self.latency_s) - self.sigma ** 2 / 2  # so that the mean is latency_s
      time.sleep(self.delays.lognormvariate(mu, self.sigma))
    done = self.turn + 1 >= self.turns
    return Step(f"next: and the {WORDS[(self.seed + self.turn) % len(WORDS)]}?", 0.0, done, False, {})

  def expert_action(self):
    return "ok"

  def random_action(self, rng):
    return "ok"


def build_sampler(a) -> Sampler:
  cfg = ModelConfig(vocab_size=264, dim=a.dim, n_layers=a.layers, n_heads=4, n_kv_heads=2, head_dim=a.dim // 4,
                    mlp_dim=3 * a.dim)
  policy = Transformer(cfg, rngs=nnx.Rngs(a.seed))
  stops = [TOK.eos_id] + list(range(200, 200 + a.stops - 1))
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=stops, log_compiles=False)


def engines(a, sampler):
  factory = lambda: ChatterEnv(a.min_turns, a.max_turns, a.prompt_chars, a.latency_ms / 1000, a.latency_sigma)
  kw = dict(group_size=a.group, turn_token_budget=a.budget, context_cap=a.context_cap, env_name="chatter",
            num_env_threads=a.tasks * a.group, sampling=SamplingParams(temperature=1.0))
  arms = {"lockstep": RolloutEngine(sampler, TOK, factory, **kw)}
  for rows in a.rows:
    arms[f"continuous r={rows}"] = ContinuousEngine(sampler, TOK, factory, rows=rows, chunk=a.chunk, **kw)
  arms["continuous+group"] = ContinuousEngine(sampler, TOK, factory, rows=a.rows[0], chunk=a.chunk,
                                              group_prefill=True, **kw)
  return arms


def play(engine, a):
  tasks = [a.seed * 1000 + i for i in range(a.tasks)]
  t0 = time.perf_counter()
  res = engine.run(tasks, group_keys=[jax.random.fold_in(jax.random.key(a.seed), i) for i in range(a.tasks)],
                   group_ids=list(range(a.tasks)))
  return res, time.perf_counter() - t0


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tasks", type=int, default=16)
  p.add_argument("--group", type=int, default=4)
  p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[16, 8, 32],
                 help="continuous decode rows; the first is the headline")
  p.add_argument("--chunk", type=int, default=16)
  p.add_argument("--budget", type=int, default=128)
  p.add_argument("--stops", type=int, default=4)
  p.add_argument("--min_turns", type=int, default=2)
  p.add_argument("--max_turns", type=int, default=5)
  p.add_argument("--prompt_chars", type=int, default=300)
  p.add_argument("--latency_ms", type=float, default=50.0)
  p.add_argument("--latency_sigma", type=float, default=0.8)
  p.add_argument("--context_cap", type=int, default=1024)
  p.add_argument("--dim", type=int, default=128)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--warmups", type=int, default=1)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args()

  sampler = build_sampler(a)
  arms = engines(a, sampler)
  n = a.tasks * a.group
  print(f"{n} sessions ({a.tasks} tasks x {a.group}), {a.min_turns}-{a.max_turns} turns, budget {a.budget}, "
        f"env latency log-normal mean {a.latency_ms:g} ms (sigma {a.latency_sigma}); policy d={a.dim} "
        f"L={a.layers}; {jax.devices()[0].platform}, {os.cpu_count()} cpus", flush=True)
  rows = {}
  ref = None
  for name, eng in arms.items():
    t0 = time.perf_counter()
    for _ in range(a.warmups):  # compiles (a continuous run's shapes vary a little with env timing)
      res, _ = play(eng, a)
    warm = time.perf_counter() - t0
    compiled = sampler.compile_count()["total"]
    walls = []
    for _ in range(a.reps):
      res, wall = play(eng, a)
      walls.append(wall)
    wall = statistics.median(walls)
    late_compiles = sampler.compile_count()["total"] - compiled
    led = res.ledger
    led.check(res.sessions)
    tokens = [[t.action_ids.tolist() for t in s.turns] for s in res.sessions]
    if ref is None:
      ref = tokens
    same = sum(x == y for x, y in zip(ref, tokens))
    rows[name] = dict(wall_s=wall, walls=walls, warmup_s=warm, sessions_per_s=n / wall,
                      slot_util=led.slot_utilisation, generated=led.generated_total,
                      row_steps=led.decode_row_steps, prefilled=led.prefilled_total,
                      prefill_saved=led.prefill_saved_total, generate_s=res.timing.generate_s,
                      prefill_s=res.timing.prefill_s, env_s=res.timing.env_s, same_sessions=same,
                      turns=led.turns, late_compiles=late_compiles)
    print(f"  {name}: {wall:.2f} s (reps {[round(w, 2) for w in walls]}, warm-up {warm:.1f} s, "
          f"{late_compiles} new shapes compiled in the timed reps)", flush=True)
  lengths = np.asarray([len(t.action_ids) for s in res.sessions for t in s.turns])

  head = f"continuous r={a.rows[0]}"
  lock, cont, grp = rows["lockstep"], rows[head], rows["continuous+group"]
  print()
  print(f"action lengths: min {lengths.min()}, p5 {np.percentile(lengths, 5):.0f}, median "
        f"{np.median(lengths):.0f}, p95 {np.percentile(lengths, 95):.0f}, max {lengths.max()} "
        f"({(lengths >= a.budget).mean():.0%} cut at the budget); {lock['turns']} turns")
  print()
  print("| arm | rows | wall (s) | sessions/s | slot util | decode / prefill / env-wait (s) | prefilled | "
        "same sessions |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for name, r in rows.items():
    nrows = n if name == "lockstep" else int(name.split("=")[1]) if "=" in name else a.rows[0]
    print(f"| {name} | {nrows} | {r['wall_s']:.2f} | {r['sessions_per_s']:.1f} | {r['slot_util']:.3f} | "
          f"{r['generate_s']:.2f} / {r['prefill_s']:.2f} / {r['env_s']:.2f} | {r['prefilled']} | "
          f"{r['same_sessions']}/{n} |")
  saved_frac = grp["prefill_saved"] / (grp["prefilled"] + grp["prefill_saved"])
  ratio = cont["sessions_per_s"] / lock["sessions_per_s"]
  print()
  print(f"sessions/s continuous / lockstep: {ratio:.2f} (goal >= 2); slot utilisation {lock['slot_util']:.3f} -> "
        f"{cont['slot_util']:.3f} (goal >= 0.8 where lockstep < 0.5); group prefill saves "
        f"{saved_frac:.1%} of prefill tokens")
  out = {"sessions_per_s_ratio": round(ratio, 3), "slot_util_lockstep": round(lock["slot_util"], 4),
         "slot_util_continuous": round(cont["slot_util"], 4), "prefill_saved_frac": round(saved_frac, 4),
         "sessions_per_s_lockstep": round(lock["sessions_per_s"], 2),
         "sessions_per_s_continuous": round(cont["sessions_per_s"], 2),
         "sessions_per_s_continuous_group": round(grp["sessions_per_s"], 2),
         "rows": {k: {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items() if kk != "walls"}
                  for k, v in rows.items()},
         "args": vars(a), "date": datetime.date.today().isoformat(), "machine": platform.platform()}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
