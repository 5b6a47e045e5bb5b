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
  one process: each run ends with its final evaluation, plays 3 RL updates of BabyAI sessions with
  no env error, and shows its path in the ledger (continuous: decode-row accounting; trees: more
  sessions than tasks x group because siblings share their prefix, and prefill saved; async:
  staleness bounded by eta). Breaks checked: `rollout=` ignored by the config (every run lockstep:
  the continuous and tree checks fail); an env error in every step (`_step` raising: env_errors)."""
  cmd = [sys.executable, "experiments/sweep.py", "--config", "configs/babyai.py:runlocal=true",
         "--grid", "rollout=lockstep,continuous,async,tree", "--root", str(tmp_path), "--in_process", *TINY]
  proc = subprocess.run(cmd, cwd=ROOT, env=env_one_device(), capture_output=True, text=True, timeout=3000)
  assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
  rl_lines = {}
  for path in ("lockstep", "continuous", "async", "tree"):
    workdir = os.path.join(tmp_path, f"rollout={path}")
    recs = read_metrics(workdir)
    assert any(r["stage"] == "eval" and "eval/success" in r for r in recs), path
    rl = [r for r in recs if r["stage"] == "rl" and "ledger/sessions" in r]
    assert len(rl) == 3, (path, len(rl))
    assert all(r["rollout/env_errors"] == 0 and r["ledger/turns"] > 0 for r in rl), path
    with open(os.path.join(workdir, "config.json")) as f:
      assert json.load(f)["env"]["name"] == "babyai"
    rl_lines[path] = rl
  assert all("ledger/decode_row_steps" in r for r in rl_lines["continuous"])
  assert not any("ledger/decode_row_steps" in r for r in rl_lines["lockstep"])
  assert any(r.get("ledger/tokens_prefill_saved", 0) > 0 for r in rl_lines["tree"])
  assert all(r["staleness/max"] <= 1 for r in rl_lines["async"])
