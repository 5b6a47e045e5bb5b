"""Round 3's probe records (issue 41 item 3): the ceiling of `delayed(cue=True)` on the RL cells' own env, per
seed (records.ceiling_record with args, records.round3_ceilings, the runner writing them), and the warm start's
turn-0 decision shares in its warm record (records.decision_shares).

Each test names the break it was checked against (edits made in a scratch copy and reverted).
"""
import json
import os

import numpy as np

from experiments.study import records, runner
from mtrl_jax.compile import cache as compile_cache
from mtrl_jax.envs import registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROV = {"commit": "c0ffee", "dirty": False, "tree": None}
H2 = "probe=delayed,horizon=2,cue=true"
OFFSET, TASKS = 1_000_000, 256  # configs/study.py's RL eval tasks


def _expert(draw_seed: int, horizon: int = 2) -> float:
  """The expert on the eval tasks of delayed(cue) with the seed's draws, task j as session j, by hand."""
  env = registry.make("delayed", horizon=horizon, cue=True, draw_seed=draw_seed)
  wins = 0
  for j in range(TASKS):
    env.reset(OFFSET + j, j)
    while True:
      step = env.step(env.expert_action())
      if step.terminated or step.truncated:
        wins += bool(step.info["success"])
        break
  return wins / TASKS


def test_round_3s_ceiling_is_the_expert_on_each_seeds_own_draws_and_reproducible():
  """ceiling_record("delayed", 2, args={cue, draws}) over seeds 0-3: per seed, the hand loop's expert with the
  cue and draw_seed = seed on the 256 eval tasks; the mean is its "ceiling"; named for the cue warm start (the
  warm record's name); a second call gives the same record. Round 2's config (probe and horizon only) plays
  seed 0's draws on every seed: its ceiling, the same value four times, is not the per-seed list.

  Breaks checked: ceiling_record building `probe=...,horizon=...` only (round 2's env, whatever the args)
  fails the hand loop (0.949 on every seed, where seeds 1-3 read 0.957, 0.938, 0.945); the seed left out of
  the config string (draw_seed 0 on every seed) fails it the same; records.ceiling resetting without the
  session id (system entropy: not reproducible) fails it too, before the second call's equality."""
  seeds = (0, 1, 2, 3)
  rec = records.ceiling_record("delayed", 2, PROV, {"cue": True, "draws": True}, seeds)
  hand = [_expert(s) for s in seeds]
  assert rec["per_seed"] == hand
  assert rec["ceiling"] == float(np.mean(hand)) and rec["seeds"] == list(seeds)
  assert (rec["warm"], rec["tasks"], rec["seed_offset"]) == (H2, TASKS, OFFSET)
  assert rec["args"] == {"cue": True, "draws": True}
  round2 = records.ceiling_record("delayed", 2, PROV)["ceiling"]
  assert rec["per_seed"] != [round2] * len(seeds)
  assert records.ceiling_record("delayed", 2, PROV, {"cue": True, "draws": True}, seeds) == rec


def test_round_2s_ceiling_record_is_written_as_before(tmp_path):
  """ceiling_record without args writes round 2's record byte for byte: the committed
  docs/study/ceilings/probe=bifurcation,horizon=8.json from its own commit (bifurcation's draws are shared
  by a task's sessions, so it does not depend on the session numbering that came later).

  Break checked: the round-2 branch returning round 3's fields (args, seeds, per_seed) fails the bytes."""
  path = os.path.join(REPO, "docs", "study", "ceilings", "probe=bifurcation,horizon=8.json")
  committed = open(path).read()
  prov = {"commit": json.loads(committed)["commit"]}
  written = records.write(str(tmp_path), records.ceiling_record("bifurcation", 8, prov))
  assert open(written).read() == committed


def test_the_ceilings_command_writes_round_3s_probes(tmp_path, monkeypatch, capsys):
  """`python -m experiments.study.records --ceilings --round 3 --out O` (in process): one record per probe of
  round 3's plan (delayed(cue) at H 2, 8, 32), each over the plan's 8 seeds, its paths printed as the JSON line.

  Break checked: main without its `--round 3` branch writes round 2's probes (here the one cheap probe the
  test leaves in records.PROBES) and fails the names."""
  monkeypatch.setattr(records, "PROBES", (("bifurcation", 2),))
  out = str(tmp_path / "out")
  n = records.main(["--ceilings", "--round", "3", "--out", out])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == n
  got = records.load(out)["ceilings"]
  assert list(got) == [f"probe=delayed,horizon={h},cue=true" for h in (2, 32, 8)]  # load's order: sorted paths
  assert all(r["seeds"] == list(range(8)) and len(r["per_seed"]) == 8 for r in got.values())


def _warm_workdir(path, line: dict) -> str:
  os.makedirs(path)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"stage": "sft", "step": 10, "sft/loss": 3.0}) + "\n")
    f.write(json.dumps({"stage": "sft", "step": 20, **line}) + "\n")
  return str(path)


def test_the_warm_record_keeps_the_turn_0_decision_shares_sampled_and_greedy(tmp_path):
  """The runner's record of a finished warm start (runner.write_record -> records.warm_record) from a
  metrics.jsonl shaped as a delayed(cue) h2 runlocal warm start logged it (2026-11-29): sampled
  `eval/decision_uncued` 1.0 and no `eval/decision_cued` (the eval writes only decisions some session took),
  greedy both. The record keeps the four shares, the absent one as 0; a warm start without a cue (round 2's
  delayed: `decision_left`) gets none, so round 2's warm records keep their fields.

  Breaks checked: warm_record without the shares fails the first record; the absent share left out (not 0)
  fails `decision_cued`; `eval/decision_*` copied whatever the decision (left/right too) fails the second."""
  line = {"eval/success": 0.0, "eval/greedy_success": 0.25, "eval/decision_uncued": 1.0,
          "eval/greedy_decision_cued": 0.5, "eval/greedy_decision_uncued": 0.5}
  out = str(tmp_path / "records")
  path = runner.write_record(out, {}, H2, _warm_workdir(tmp_path / "w", line))
  rec = json.load(open(path))
  assert rec["kind"] == "warm" and rec["warm"] == H2
  assert {k: rec[k] for k in ("success", "greedy_success", "decision_cued", "decision_uncued",
                              "greedy_decision_cued", "greedy_decision_uncued")} == {
      "success": 0.0, "greedy_success": 0.25, "decision_cued": 0.0, "decision_uncued": 1.0,
      "greedy_decision_cued": 0.5, "greedy_decision_uncued": 0.5}
  plain = {"eval/success": 0.64, "eval/greedy_success": 0.94, "eval/decision_left": 0.6, "eval/decision_right": 0.4}
  rec2 = records.warm_record(_warm_workdir(tmp_path / "w2", plain), "probe=delayed,horizon=8", PROV)
  assert set(rec2) == {"schema", "kind", "warm", "commit", "dirty", "tree", "sft_steps", "success",
                       "greedy_success", "ceiling", "ceiling_tasks", "sft_loss", "wall_s", "machine"}


def test_the_round_3_runner_writes_the_ceilings_of_the_probes_it_runs(tmp_path, monkeypatch):
  """`--round 3 --horizons 2 --arms ms_grpo --warm_only` with its warm start already built: nothing runs, and
  the records folder gets the h2 probe's ceiling record (the plan's 8 seeds, equal to ceiling_record's) and
  no other probe's; a relaunch keeps the record it finds (written once, as a job's record is).

  Breaks checked: the runner without its round3_ceilings call writes no ceiling; missing_only dropped
  rewrites the planted record."""
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))  # main sets it with setdefault
  root, out = tmp_path / "root", str(tmp_path / "records")
  _warm_workdir(root / "warm" / H2, {"eval/success": 0.5})
  argv = ["--round", "3", "--root", str(root), "--records", out, "--horizons", "2", "--arms", "ms_grpo",
          "--warm_only"]
  assert runner.main(argv) == 0
  got = records.load(out)["ceilings"]
  assert sorted(got) == [H2]
  want = records.ceiling_record("delayed", 2, PROV, {"cue": True, "draws": True}, range(8))
  assert got[H2]["per_seed"] == want["per_seed"] and got[H2]["seeds"] == list(range(8))
  path = os.path.join(out, "ceilings", f"{H2}.json")
  with open(path, "w") as f:
    json.dump({**got[H2], "ceiling": -1.0}, f)
  assert runner.main(argv) == 0
  assert records.load(out)["ceilings"][H2]["ceiling"] == -1.0
