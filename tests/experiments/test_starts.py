"""The start check (experiments/study/starts.py): a run is launched only from the starts its records name.

Each test names the break it was checked against (edits made in a scratch copy and reverted).
"""
import json
import os

import numpy as np

from experiments.study import records, round3, runner, starts
from experiments.study.plan import planned_runs

H2 = "probe=delayed,horizon=2,cue=true"
FULL, PARTIAL = f"{H2},critic,seed=0", f"{H2},vpr=0.3,critic,seed=0"
PROV = {"commit": "c0ffee", "dirty": False, "tree": None}


def _critic_line(ev: float, rounds: int) -> dict:
  return {"stage": "value_pretrain", "step": 40, "value_pretrain/final": 1, "value_pretrain/explained_variance": ev,
          "value_pretrain/oracle_explained_variance": 0.3423979650001212, "value_pretrain/critic_steps": 120,
          "value_pretrain/rounds": rounds, "value_pretrain/stopped_at_ratio": 1.0}


def _workdir(path, *lines) -> str:
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for line in lines:
      f.write(json.dumps(line) + "\n")
  return str(path)


def _root(tmp_path, partial_ev: float = 0.12697619905851498) -> str:
  """A study root whose H=2 policy warm start and both critics are finished (metrics shaped as theirs)."""
  root = tmp_path / "root"
  _workdir(root / "warm" / H2, {"stage": "sft", "step": 590, "sft/loss": 0.0287140328437090},
           {"stage": "sft", "step": 600, "sft/loss": 0.02813837677240372, "eval/success": 0.640625,
            "eval/greedy_success": 0.5})
  _workdir(root / "warm" / FULL, _critic_line(0.28625580968335373, 24))
  _workdir(root / "warm" / PARTIAL, _critic_line(partial_ev, 16))
  return str(root)


def _records(root: str, out: str) -> None:
  """The records of the root's starts, as the runner writes them (the recorded starts)."""
  for name in (H2, FULL, PARTIAL):
    records.write(out, starts.rebuilt_record(root, name))


def test_differences_are_exact_on_what_the_job_produced_and_ignore_how_it_ran(tmp_path):
  """A critic record against itself with its code, machine and wall time changed: no difference; with its EV
  one float step away (np.nextafter): named, both values shown; a readout key the old record lacks (None)
  and a warm record's sft_loss missing from an old record are not compared; a warm record whose sft_loss
  moved by one step is named.

  Breaks checked: comparing with a tolerance (np.isclose) misses the one-step EV; comparing every key
  (commit, machine, wall_s included) flags the first case; comparing fields the old record lacks flags the
  old warm record."""
  root = _root(tmp_path)
  crit = starts.rebuilt_record(root, PARTIAL)
  other = {**crit, "commit": "beef", "tree": {"mtrl_jax": "x"}, "machine": {"cpu": "elsewhere"}, "wall_s": 1.0}
  assert starts.differences(crit, other) == []
  ev = crit["readout"]["explained_variance"]
  moved = {**crit, "readout": {**crit["readout"], "explained_variance": float(np.nextafter(ev, 1.0))}}
  diff = starts.differences(crit, moved)
  assert diff == [f"readout.explained_variance: recorded {ev!r}, rebuilt {float(np.nextafter(ev, 1.0))!r}"]
  assert starts.differences({**crit, "readout": {**crit["readout"], "r2": None}},
                            {**crit, "readout": {**crit["readout"], "r2": 0.5}}) == []
  warm = starts.rebuilt_record(root, H2)
  assert warm["sft_loss"] == 0.02813837677240372
  old = {k: v for k, v in warm.items() if k != "sft_loss"}
  assert starts.differences(old, {**warm, "sft_loss": 0.5}) == []
  assert starts.differences(warm, {**warm, "sft_loss": float(np.nextafter(warm["sft_loss"], 1.0))})[0].startswith(
      "sft_loss: recorded 0.02813837677240372")


def test_a_critic_that_differs_refuses_every_run_of_its_policy_warm_start_and_no_other():
  """bad = H=2's partial critic: every H=2 run of the plan (seed 0) is refused, the critic-free and vp-off arms
  too (their policy warm start is the one under the critic), and no H=8 run is.

  Breaks checked: `refused` looking at each run's own critic only (critic_warm) keeps ms_grpo and the vp-off
  and full-critic arms; taking the critic's name as its policy (no policy_warm) refuses nothing."""
  runs = planned_runs([], (0,), None, (2, 8), experiments=round3.EXPERIMENTS)
  no = set(starts.refused(runs, {PARTIAL: ["x"]}))
  h2 = {n for n in runs if ",horizon=2," in n}
  assert no == h2 and len(h2) == 27
  assert {n for n in runs if ",horizon=8," in n}.isdisjoint(no)
  assert any(",arm=ms_grpo," in n for n in no) and any("vp=false" in n for n in no)


def test_the_runner_launches_nothing_from_a_start_that_differs_from_its_record(tmp_path, launched, capsys):
  """A root whose H=2 partial critic has EV 0.15056 (the Intel rebuild's) where the record says 0.12698:
  `--round 3 --only E1 --horizons 2 --seeds 1` exits 1, launches none of E1's H=2 runs, prints the start and
  its difference, keeps the recorded critic byte for byte and writes the rebuilt one under
  ROOT/start_mismatch/; a root with the recorded EV launches every E1 H=2 seed-0 run and exits 0.

  Breaks checked: the runner without its starts.check call launches the runs from the mismatched root; the
  record callback writing start records unconditionally (as before) is not caught here (the pool is faked)
  but by the next test; the refused runs left in run_jobs launch them."""
  out = str(tmp_path / "records")
  _records(_root(tmp_path / "a"), out)
  recorded = open(os.path.join(out, "critics", f"{H2},vpr=0.3,seed=0.json")).read()
  root = _root(tmp_path / "b", partial_ev=0.15056004348458718)
  argv = ["--round", "3", "--root", root, "--records", out, "--only", "E1", "--horizons", "2", "--seeds", "1"]
  assert runner.main(argv) == 1
  assert launched.get("run", []) == []
  err = capsys.readouterr().err
  assert "readout.explained_variance: recorded 0.12697619905851498, rebuilt 0.15056004348458718" in err
  assert open(os.path.join(out, "critics", f"{H2},vpr=0.3,seed=0.json")).read() == recorded
  mis = json.load(open(os.path.join(root, starts.MISMATCH_DIR, "critics", f"{H2},vpr=0.3,seed=0.json")))
  assert mis["readout"]["explained_variance"] == 0.15056004348458718
  launched.clear()
  assert runner.main(argv[:3] + [_root(tmp_path / "c")] + argv[4:]) == 0
  assert sorted(launched["run"]) == sorted(planned_runs(["E1"], (0,), None, (2,), experiments=round3.EXPERIMENTS))


def test_a_recorded_run_is_skipped_and_a_rebuilt_start_never_overwrites_its_record(tmp_path, launched, capsys):
  """With one E1 H=2 seed-0 run already recorded, the runner launches the other runs only (and says how many it
  skipped); `--rerun` launches that one too. The record callback, given a finished critic whose record
  exists, leaves the record as it was; given a start with no record, writes one.

  Breaks checked: the recorded-run skip removed launches all 10; `--rerun` ignored launches 9; the record
  callback writing start records unconditionally (the old behaviour) overwrites the recorded critic."""
  out = str(tmp_path / "records")
  root = _root(tmp_path)
  _records(root, out)
  runs = planned_runs(["E1"], (0,), None, (2,), experiments=round3.EXPERIMENTS)
  first = sorted(runs)[0]
  records.write(out, {"schema": records.SCHEMA, "kind": "run", "cell": first.rpartition(",seed=")[0], "seed": 0})
  argv = ["--round", "3", "--root", root, "--records", out, "--only", "E1", "--horizons", "2", "--seeds", "1"]
  assert runner.main(argv) == 0
  assert sorted(launched["run"]) == sorted(runs)[1:]
  assert f"1 of {len(runs)} runs already recorded" in capsys.readouterr().out
  launched.clear()
  assert runner.main(argv + ["--rerun"]) == 0
  assert sorted(launched["run"]) == sorted(runs)

  calls = []

  def pool(jobs, parallel, what, on_done=None, in_process=False):
    calls.append(what)
    if what == "critic":  # pretend the partial critic was just rebuilt, differently
      _workdir(os.path.join(root, "warm", PARTIAL), _critic_line(0.5, 3))
      on_done(PARTIAL, os.path.join(root, "warm", PARTIAL))
      new = os.path.join(tmp_path, "fresh")
      on_done("fresh", _workdir(new, {"stage": "sft", "step": 600, "sft/loss": 0.1, "eval/success": 0.5}))
    return []
  runner._pool = pool  # the fixture's monkeypatch restores the module attribute afterwards
  before = open(os.path.join(out, "critics", f"{H2},vpr=0.3,seed=0.json")).read()
  assert runner.main(argv + ["--rerun"]) == 1  # the rebuilt critic differs from its record: its runs refused
  assert open(os.path.join(out, "critics", f"{H2},vpr=0.3,seed=0.json")).read() == before
  assert os.path.exists(os.path.join(out, "warm", "fresh.json"))


def test_a_warm_start_that_differs_gets_no_critic_built_and_no_run(tmp_path, launched, capsys):
  """A root whose H=2 policy warm start's sft_loss differs from its record (and whose critics are not built):
  the runner builds neither critic on it, launches none of its runs, and names the warm start.

  Breaks checked: the early warm check removed builds both critics (and then reports them 'not built')."""
  out = str(tmp_path / "records")
  _records(_root(tmp_path / "a"), out)
  root = tmp_path / "b"
  _workdir(root / "warm" / H2, {"stage": "sft", "step": 600, "sft/loss": 0.5, "eval/success": 0.640625,
                                "eval/greedy_success": 0.5})
  argv = ["--round", "3", "--root", str(root), "--records", out, "--only", "E1", "--horizons", "2", "--seeds", "1"]
  assert runner.main(argv) == 1
  assert launched.get("critic", []) == [] and launched.get("run", []) == []
  assert "sft_loss: recorded 0.02813837677240372, rebuilt 0.5" in capsys.readouterr().err
