"""The TextWorld job end to end, through experiments/sweep.py, under each rollout path (slow).

configs/textworld.py:runlocal=true on the tiny level-3 coin-collector pool, cut to a 1-layer model
and a single RL update: every stage runs (demos of the walkthrough expert, SFT, RL, the final
evaluation on held-out games) with the lockstep engine, continuous batching, async actors and
trees. The engines' contract with the env is tested quickly in test_textworld_rollout.py.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("textworld")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATHS = {
    "lockstep": [],
    "continuous": ["--config.rollout.continuous=true", "--config.rollout.rows=4"],
    "async": ["--config.asynchronous.enabled=true", "--config.asynchronous.actors=2"],
    "tree": ["--config.rollout.tree.enabled=true", "--config.rollout.tree.branch_turns=(1,)"],
}
TINY = ["--config.model.n_layers=1", "--config.model.dim=32", "--config.model.mlp_dim=64",
        "--config.model.head_dim=8", "--config.rl.steps=1", "--config.sft.steps=2", "--config.demos.episodes=8",
        "--config.eval.tasks=2", "--config.env.kwargs.games=3", "--config.env.kwargs.eval_games=2"]


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_textworld_job_runs_through_the_sweep_on_each_rollout_path(tmp_path, path):
  """Break checked: a TextWorld env whose deepcopy starts a fresh game (no replay) ends the tree run's
  forked sessions wrong (caught quickly in test_textworld_rollout.py); here a job that fails any stage
  fails the sweep's exit code or leaves no final evaluation line."""
  env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0", JAX_PLATFORMS="cpu",
             PYTHONPATH=ROOT)
  cmd = [sys.executable, "experiments/sweep.py", "--config", "configs/textworld.py:runlocal=true,level=3",
         "--grid", "seed=0", "--root", str(tmp_path), *TINY, *PATHS[path]]
  res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  recs = [json.loads(l) for l in open(tmp_path / "seed=0" / "metrics.jsonl") if l.startswith("{")]
  final = [r for r in recs if r.get("stage") == "eval"]
  assert final and "eval/success" in final[-1] and final[-1]["eval/env_errors"] == 0
  rl = [r for r in recs if r.get("stage") == "rl" and "rollout/success" in r]
  assert rl and rl[-1].get("rollout/env_errors", 0) == 0
