"""Tree rollouts vs independent chains at an equal token budget.

    python benchmarks/tree_rollouts.py                     # the default: 10 RL seeds, trees train on 2G leaves per task
    python benchmarks/tree_rollouts.py --budget 60000 --rl_seeds 0   # a quick look
    python benchmarks/tree_rollouts.py --rl_seeds 0,1,2            # fewer seeds (eval per seed, paired difference)
    python benchmarks/tree_rollouts.py --tree_group 0      # trees spend their saving on more updates of G leaves instead
    python benchmarks/tree_rollouts.py --tree_estimators tree:scale_by_std=false   # an estimator's hyper-parameters

The `memory` probe (length 3 with the hint, as in the main job: five turns).
A tiny policy (2 layers, d=64) is warm-started once by behaviour cloning
(cached in --workdir). Then:

1. Sessions per token. From the warm start, each arm plays batches of
   T tasks x G sessions until --count_budget generated + prefilled tokens
   are spent; complete sessions per token, trees over chains.
   chains: `RolloutEngine`, G independent sessions per task;
   trees:  `TreeRolloutEngine`, --branch_turns / --width (default: fork at
           turns 0 and 2, width 2: two trees of four leaves per task), so
           siblings share the prompt and the turns before their fork.
2. Training at equal tokens. From the same warm start, each arm trains
   (T x G sessions per update, the same learner) until --budget tokens are
   spent: chains with MS-GRPO (the main job's estimator); trees once per
   --tree_estimators entry (default: the `tree` estimator, group- plus
   tree-normalised return, and MS-GRPO over the task's leaves). By default a tree
   update plays 2G leaves per task (--tree_group, default 2 x --group): the
   trees spend their token saving on larger groups, as Tree-GRPO does, so
   both arms make about as many updates of about as many tokens. With
   --tree_group 0 a tree update plays G leaves and costs fewer tokens, so
   the trees get about twice the updates instead. Each arm trains once per
   --rl_seeds entry from the same warm start; both final policies are
   evaluated on the same held-out tasks (sampled at temperature 1), and the
   difference is paired by seed. The eval also reports the peek rate (turn-0
   action `peek`): a policy that stops peeking can only guess (success ~0.1).

Prints a table, then (last line) one JSON object with
`sessions_per_token_ratio`, `tree_eval_success` (the `tree` estimator's arm),
`chain_eval_success`, `tokens`, the per-seed lists and paired differences,
and `tree_<estimator>_...` keys for the other tree arms.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import jax
import numpy as np
from absl import logging

from mtrl_jax.config import base_config
from mtrl_jax.credit.registry import estimator_names, make_advantage_fn
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.parallel.sharded_step import init_opt_state
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.tree import TreeRolloutEngine, TreeSpec
from mtrl_jax.sampling.sampler import Sampler, SamplingParams
from mtrl_jax.train.async_source import copy_params
from mtrl_jax.train.evaluate import session_stats
from mtrl_jax.train.rl_step import LearnerState
from mtrl_jax.train.run import Run
from mtrl_jax.train.source import SyncSource


def bench_config(args):
  c = base_config()
  c.seed = args.seed
  c.stages = ("demos", "sft")
  c.critic.kind = "none"
  c.env.name = "memory"
  c.env.kwargs.update(length=args.length, hint=True, code_alphabet="letters")
  c.demos.episodes = 500
  c.sft.steps = args.sft_steps
  # A long nominal schedule: the learning rate stays ~constant for both arms,
  # whatever number of updates their budget buys.
  c.rl.update(estimator="ms_grpo", steps=10_000, tasks_per_update=args.tasks, group_size=args.group,
              minibatches=2, epochs=1, lr=args.lr, warmup_steps=0)
  c.rollout.update(turn_budget=8, context_cap=256)
  c.checkpoint.async_save = False
  c.log.tensorboard = False
  return c


def parse_estimator(spec: str) -> tuple[str, dict]:
  """'name' or 'name:key=value:key=value' -> (name, hparams); values true/false, ints or floats.

  e.g. 'tree:scale_by_std=false' is the `tree` estimator without the division by the std.
  """
  name, *pairs = spec.split(":")
  hparams = {}
  for pair in pairs:
    key, sep, raw = pair.partition("=")
    if not sep or not key:
      raise ValueError(f"estimator {spec!r}: expected key=value after ':', got {pair!r}")
    low = raw.lower()
    if low in ("true", "false"):
      hparams[key] = low == "true"
    else:
      try:
        hparams[key] = int(raw)
      except ValueError:
        try:
          hparams[key] = float(raw)
        except ValueError:
          raise ValueError(f"estimator {spec!r}: {key}={raw!r} is not true/false or a number") from None
  make_advantage_fn(name, **hparams)  # unknown names and hyper-parameters fail here, before any compute
  return name, hparams


class Bench:
  def __init__(self, args):
    self.args = args
    self.c = bench_config(args)
    t0 = time.perf_counter()
    workdir = os.path.join(args.workdir, f"memory{args.length}_sft{args.sft_steps}_seed{args.seed}")
    self.run = Run(self.c, workdir)
    self.run.run()  # SFT, or a restore when the workdir has it
    self.sft_s = time.perf_counter() - t0
    self.tok, self.learner, self.sampler = self.run.tok, self.run.learner, self.run.sampler
    self.sft_params = copy_params(self.learner.state.policy)
    env_kw = dict(self.c.env.kwargs)
    factory = lambda: env_registry.make("memory", **env_kw)
    common = dict(group_size=args.group, turn_token_budget=8, context_cap=256,
                  sampling=SamplingParams(temperature=1.0), num_env_threads=4, env_name="memory")
    self.spec = TreeSpec(tuple(int(t) for t in args.branch_turns.split(",")), args.width)
    self.engines = {"chains": RolloutEngine(self.sampler, self.tok, factory, **common),
                    "trees": TreeRolloutEngine(self.sampler, self.tok, factory, tree=self.spec, **common)}
    # Training: trees may play more leaves per task than chains play sessions (--tree_group).
    self.engines["trees_train"] = TreeRolloutEngine(
        self.sampler, self.tok, factory, tree=self.spec, **{**common, "group_size": args.tree_group or args.group})
    self.eval_sampler = Sampler(self.run.sampler_gd, copy_params(self.sft_params), pad_id=self.tok.pad_id,
                                stop_ids=(self.tok.eos_id,), log_compiles=False)
    self.eval_engine = RolloutEngine(self.eval_sampler, self.tok, factory, group_size=1, turn_token_budget=8,
                                     context_cap=256, sampling=SamplingParams(temperature=1.0),
                                     num_env_threads=4, env_name="memory")

  def reset(self, estimator: str):
    L = self.learner
    p = copy_params(self.sft_params)
    L.state = LearnerState(p, init_opt_state(L.tx_policy, p, L.state_sh.opt_policy), {}, {})
    L.version, L.nonfinite_in_a_row = 0, 0
    name, hparams = parse_estimator(estimator)
    L.set_estimator(name, hparams)
    self.sampler.set_params(copy_params(p), 0)
    return L

  def evaluate(self, params) -> tuple[float, float]:
    """(success, peek rate) on the held-out tasks. A policy that stops peeking
    can only guess the code: success about 1 / num_codes = 0.1."""
    self.eval_sampler.set_params(params, 0)
    seeds = [1_000_000 + i for i in range(self.args.eval_tasks)]
    sessions = self.eval_engine.run(seeds, jax.random.key(99)).sessions
    peek = float(np.mean([bool(s.turns) and s.turns[0].action.strip() == "peek" for s in sessions]))
    return session_stats(sessions, "")["success"], peek


def paired_difference(arm: list[float], base: list[float]) -> tuple[float, float]:
  """Mean and standard error of arm - base, paired by seed (s.e. nan for one seed)."""
  if len(arm) != len(base):
    raise ValueError(f"paired_difference: {len(arm)} seeds against {len(base)}")
  d = np.asarray(arm, np.float64) - np.asarray(base, np.float64)
  return float(d.mean()), (float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan"))


def tokens_of(info) -> float:
  return info["ledger/tokens_generated"] + info["ledger/tokens_prefilled"]


def count_sessions(b: Bench, arm: str) -> dict:
  """Complete sessions the warm start plays within --count_budget tokens."""
  b.reset("ms_grpo")
  source = SyncSource(b.engines[arm], seed=b.args.seed + 1, tasks_per_update=b.args.tasks)
  tokens = sessions = 0.0
  done = 0
  while tokens < b.args.count_budget:
    ss, info = source.next_batch(done)
    sessions += sum(s.done and not s.env_error for s in ss)
    tokens += tokens_of(info)
    done += 1
  return {"sessions": sessions, "tokens": tokens, "batches": done, "per_1k": 1000.0 * sessions / tokens}


def train_arm(b: Bench, arm: str, estimator: str, rl_seed: int = 0) -> dict:
  L = b.reset(estimator)
  # rl_seed 0 keeps the tasks and keys of the one-seed benchmark; others draw disjoint ones.
  source = SyncSource(b.engines[arm], seed=b.args.seed + 2 + 1000 * rl_seed, tasks_per_update=b.args.tasks)
  tokens, sessions, step, success = 0.0, 0, 0, []
  t0 = time.perf_counter()
  while tokens < b.args.budget:
    b.sampler.set_params(copy_params(L.policy_params_for_sampler()), L.version)
    ss, info = source.next_batch(step)
    L.update(ss, step)
    tokens += tokens_of(info)
    sessions += len(ss)
    success.append(info["rollout/success"])
    step += 1
  train_s = time.perf_counter() - t0
  eval_success, eval_peek = b.evaluate(copy_params(L.policy_params_for_sampler()))
  return {"updates": step, "tokens": tokens, "sessions": sessions, "train_s": train_s,
          "train_success_last": float(np.mean(success[-3:])), "eval_success": eval_success,
          "eval_peek": eval_peek}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tasks", type=int, default=8)
  p.add_argument("--group", type=int, default=8, help="sessions (leaves) per task")
  p.add_argument("--branch_turns", type=str, default="0,2")
  p.add_argument("--width", type=int, default=2)
  p.add_argument("--tree_group", type=int, default=None,
                 help="leaves per task when trees train (default 2 x --group: the trees' token saving buys larger "
                      "groups, as in Tree-GRPO, and both arms make about as many updates of about as many tokens; "
                      "0: --group, so the saving buys more updates instead)")
  p.add_argument("--length", type=int, default=3)
  p.add_argument("--lr", type=float, default=5e-4)
  p.add_argument("--sft_steps", type=int, default=300)
  p.add_argument("--count_budget", type=float, default=40_000)
  p.add_argument("--budget", type=float, default=150_000, help="training tokens per arm")
  p.add_argument("--eval_tasks", type=int, default=256)
  p.add_argument("--seed", type=int, default=0, help="the warm start's seed")
  p.add_argument("--rl_seeds", type=str, default="0,1,2,3,4,5,6,7,8,9",
                 help="comma-separated: each arm trains once per seed from the same warm start (other tasks and "
                      "sampling keys); eval success is reported per seed and as the mean")
  p.add_argument("--tree_estimators", type=str, default="tree,ms_grpo",
                 help="comma-separated estimators that train on the trees, one arm each (chains: ms_grpo); "
                      "hyper-parameters after colons, e.g. tree:scale_by_std=false")
  p.add_argument("--workdir", type=str, default="/tmp/mtrl_tree_bench")
  args = p.parse_args()
  for est in args.tree_estimators.split(","):
    try:
      parse_estimator(est)
    except (ValueError, TypeError) as e:
      p.error(f"--tree_estimators: {e} (registered estimators: {list(estimator_names())})")
  if args.tree_group is None:
    args.tree_group = 2 * args.group
  try:  # the tree engine's own check, before the warm start rather than after it
    spec = TreeSpec(tuple(int(t) for t in args.branch_turns.split(",")), args.width)
    if args.tree_group < 0:
      raise ValueError("must be >= 0")
    if args.tree_group:
      spec.roots(args.tree_group)
  except ValueError as e:
    p.error(f"--tree_group {args.tree_group} / --branch_turns / --width: {e}")
  logging.set_verbosity(logging.WARNING)
  t_all = time.perf_counter()
  b = Bench(args)
  count = {arm: count_sessions(b, arm) for arm in ("chains", "trees")}
  ratio = count["trees"]["per_1k"] / count["chains"]["per_1k"]
  warm, warm_peek = b.evaluate(copy_params(b.sft_params))
  rl_seeds = [int(x) for x in args.rl_seeds.split(",")]
  # (name, engine, estimator): chains with the main job's estimator; trees with each --tree_estimators entry.
  arms = [("chains", "chains", "ms_grpo")] + [
      ("trees" if est == "tree" else "trees_" + est.replace(":", "_").replace("=", "_"), "trees_train", est)
      for est in args.tree_estimators.split(",")]
  runs = {name: [] for name, _, _ in arms}
  for r in rl_seeds:  # the arms of a seed back to back: load drift hits them alike
    for name, engine, est in arms:
      runs[name].append(train_arm(b, engine, est, r))
      t = runs[name][-1]
      print(f"[rl seed {r}] {name} ({est}): {t['updates']} updates, {t['tokens']:.0f} tokens, {t['train_s']:.0f}s, "
            f"eval success {t['eval_success']:.3f}, peek rate {t['eval_peek']:.2f}", flush=True)
  train = {name: {k: float(np.mean([t[k] for t in ts])) for k in ts[0]} for name, ts in runs.items()}
  evals = {name: [t["eval_success"] for t in ts] for name, ts in runs.items()}

  def paired(name):  # eval success of a tree arm minus the chains', paired by seed: mean, s.e.
    return paired_difference(evals[name], evals["chains"])

  total_s = time.perf_counter() - t_all

  print(f"\nmemory length {args.length}, T={args.tasks} tasks x G={args.group} sessions per batch; trees: "
        f"branch at turns {list(b.spec.branch_turns)}, width {b.spec.width} ({b.spec.roots(args.group)} trees "
        f"of {b.spec.leaves} leaves per task; {args.tree_group or args.group} leaves per task in training); RL seeds "
        f"{rl_seeds} (training columns: mean over seeds)")
  print(f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, load {os.getloadavg()}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, total {total_s:.0f}s "
        f"(warm start {b.sft_s:.0f}s)")
  print("\n| rollouts | sessions in count budget | tokens | sessions / 1k tokens |\n|---|---:|---:|---:|")
  for arm in ("chains", "trees"):
    c = count[arm]
    print(f"| {arm} | {c['sessions']:.0f} | {c['tokens']:.0f} | {c['per_1k']:.2f} |")
  print("\n| arm (estimator) | train updates | train tokens | train sessions | train s | train success (last 3) "
        "| eval success | minus chains (s.e.) | eval peek rate | eval success per seed |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for name, _, est in arms:
    t = train[name]
    vs = "" if name == "chains" else "{:+.3f} ({:.3f})".format(*paired(name))
    print(f"| {name} ({est}) | {t['updates']:.1f} | {t['tokens']:.0f} | {t['sessions']:.0f} | {t['train_s']:.0f} | "
          f"{t['train_success_last']:.3f} | {t['eval_success']:.3f} | {vs} | {t['eval_peek']:.2f} | "
          f"{', '.join(f'{e:.3f}' for e in evals[name])} |")
  print(f"warm start eval success {warm:.3f} (peek rate {warm_peek:.2f}); sessions per token, trees / chains: "
        f"{ratio:.2f}")
  out = {"sessions_per_token_ratio": round(ratio, 3), "tokens": args.budget, "rl_seeds": rl_seeds,
         "chain_eval_success": round(train["chains"]["eval_success"], 4), "chain_eval_by_seed": evals["chains"],
         "chain_tokens": train["chains"]["tokens"], "chain_updates": train["chains"]["updates"]}
  for name, _, est in arms[1:]:
    key = "tree" if name == "trees" else "tree" + name[len("trees"):]  # tree_eval_success: the `tree` estimator
    diff, se = paired(name)
    out.update({f"{key}_eval_success": round(train[name]["eval_success"], 4), f"{key}_eval_by_seed": evals[name],
                f"{key}_eval_diff": round(diff, 4), f"{key}_eval_diff_se": None if np.isnan(se) else round(se, 4),
                f"{key}_eval_peek": round(train[name]["eval_peek"], 4), f"{key}_tokens": train[name]["tokens"],
                f"{key}_updates": train[name]["updates"]})
  out.update({"tree_group": args.tree_group or args.group, "chain_eval_peek": round(train["chains"]["eval_peek"], 4),
              "warm_eval_success": warm, "warm_eval_peek": warm_peek, "eval_tasks": args.eval_tasks,
              "train_sessions_per_token_ratio": round(
                  (train[arms[1][0]]["sessions"] / train[arms[1][0]]["tokens"])
                  / (train["chains"]["sessions"] / train["chains"]["tokens"]), 3),
              "total_s": round(total_s, 1)})
  print(json.dumps(out))


if __name__ == "__main__":
  main()
