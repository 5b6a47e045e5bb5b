"""configs/babyai.py as jobs: every rollout path through experiments/sweep.py (slow: they train)."""
import json
import os
import subprocess
import sys

import pytest

from mtrl_jax.metrics import read_metrics

pytest.importorskip("minigrid")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
from main_helpers import env_one_device  # noqa: E402

# A 1-layer model: the paths are under test, not what they learn.
TINY = ["--config.model.n_layers=1", "--config.model.dim=32", "--config.model.mlp_dim=64",
        "--config.model.head_dim=8", "--config.demos.episodes=16", "--config.sft.steps=4"]


@pytest.mark.slow
def test_every_rollout_path_runs_a_babyai_job_through_the_sweep(tmp_path):
  """One sweep, one run per rollout path (lockstep, continuous batching, async actors, trees), in
  one process: each run ends with its final evaluation and plays 3 RL updates of BabyAI sessions
  with no env error, and each shows its own path in the ledger: continuous batching plays the
  lockstep run's sessions (the same tokens) on another schedule (decode-row steps differ), trees
  prefill less (siblings share the prefix before their fork at turn 1), the actor pool reports its
  queue and a staleness within eta = 1. (Measured on a sweep of the byte model's runlocal size:
  lockstep 512 decode-row steps, continuous 928 / 648 / 704 for the same 424 generated tokens; the
  tree prefilled 2,332 tokens where lockstep prefilled 2,888.)"""
  cmd = [sys.executable, "experiments/sweep.py", "--config", "configs/babyai.py:runlocal=true",
         "--grid", "rollout=lockstep,continuous,async,tree", "--root", str(tmp_path), "--in_process", *TINY]
  proc = subprocess.run(cmd, cwd=ROOT, env=env_one_device(), capture_output=True, text=True, timeout=3000)
  assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
  rl = {}
  for path in ("lockstep", "continuous", "async", "tree"):
    workdir = os.path.join(tmp_path, f"rollout={path}")
    recs = read_metrics(workdir)
    assert any(r["stage"] == "eval" and "eval/success" in r for r in recs), path
    rl[path] = [r for r in recs if r["stage"] == "rl" and "ledger/sessions" in r]
    assert len(rl[path]) == 3, (path, len(rl[path]))
    assert all(r["rollout/env_errors"] == 0 and r["ledger/turns"] > 0 for r in rl[path]), path
    with open(os.path.join(workdir, "config.json")) as f:
      assert json.load(f)["env"]["name"] == "babyai"
  for lock, cont, tree in zip(rl["lockstep"], rl["continuous"], rl["tree"]):
    assert cont["ledger/tokens_generated"] == lock["ledger/tokens_generated"]
    assert tree["ledger/tokens_prefilled"] < lock["ledger/tokens_prefilled"]
  assert any(c["ledger/decode_row_steps"] != k["ledger/decode_row_steps"] for c, k in zip(rl["continuous"], rl["lockstep"]))
  assert all("queue/depth" in r and r["staleness/max"] <= 1 for r in rl["async"])
  assert not any("queue/depth" in r for r in rl["lockstep"])
