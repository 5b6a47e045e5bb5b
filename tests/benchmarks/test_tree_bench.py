"""benchmarks/tree_rollouts.py: the paired-by-seed difference it reports, and the
whole script at a tiny size (its JSON line carries the issue's keys and one
arm per --tree_estimators entry).

The end-to-end test is slow (a behaviour-cloning warm start and 3 arms x 2
seeds of training, about a minute and a half on 2 cores)."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("benchmarks_tree", os.path.join(REPO, "benchmarks", "tree_rollouts.py"))
tree_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tree_bench)


def test_paired_difference_hand_example():
  """Seeds pair up: trees [.5, .1, .4] vs chains [.4, .4, .2] differ by
  [.1, -.3, .2]: mean 0, sample std sqrt(.07), s.e. sqrt(.07 / 3) = .15275.
  Unpaired (std of each arm separately) or with the arms swapped, the
  numbers differ: catches a mean taken over unpaired lists, ddof 0, and the
  sign."""
  mean, se = tree_bench.paired_difference([0.5, 0.1, 0.4], [0.4, 0.4, 0.2])
  assert mean == pytest.approx(0.0, abs=1e-12)
  assert se == pytest.approx(math.sqrt(0.07 / 3), rel=1e-9)
  mean, _ = tree_bench.paired_difference([0.5, 0.3], [0.4, 0.1])
  assert mean == pytest.approx(0.15)
  assert math.isnan(tree_bench.paired_difference([0.5], [0.4])[1])
  with pytest.raises(ValueError, match="3 seeds against 2"):
    tree_bench.paired_difference([0.1, 0.2, 0.3], [0.1, 0.2])


def test_parse_estimator_hyper_parameters():
  """'tree:scale_by_std=false' is the tree estimator without the std
  division (a string "false" would be truthy: catches values left as
  strings); ints stay ints; unknown names and keys fail before any compute."""
  assert tree_bench.parse_estimator("ms_grpo") == ("ms_grpo", {})
  name, hp = tree_bench.parse_estimator("tree:scale_by_std=false:ddof=1:eps=1e-3")
  assert name == "tree" and hp == {"scale_by_std": False, "ddof": 1, "eps": 1e-3}
  assert hp["scale_by_std"] is False and isinstance(hp["ddof"], int)
  for bad, match in (("tree:nope=1", "unknown hyper-parameter"), ("nope", "unknown advantage estimator"),
                     ("tree:scale_by_std", "key=value"), ("tree:eps=small", "not true/false or a number")):
    with pytest.raises(ValueError, match=match):
      tree_bench.parse_estimator(bad)


@pytest.mark.slow


def test_tree_benchmark_json_line(tmp_path):
  """Catches: a tree arm dropped or renamed in the JSON (the issue's keys),
  per-seed lists of the wrong length, and a token budget not spent (tokens
  per arm below --budget). At this size every policy may score 0, so the
  difference arithmetic is checked by the hand example above."""
  cmd = [sys.executable, os.path.join(REPO, "benchmarks", "tree_rollouts.py"), "--workdir", str(tmp_path),
         "--sft_steps", "5", "--budget", "2500", "--count_budget", "1500", "--eval_tasks", "8",
         "--rl_seeds", "0,1", "--tasks", "2", "--group", "4"]
  # One CPU device, as the benchmark runs (the suite's fake 8-device flag would
  # ask a minibatch of 4 sessions to split over 8 devices).
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # compile as the suite does (tests/conftest.py)
  p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout.strip().splitlines()[-1])
  for key in ("sessions_per_token_ratio", "tree_eval_success", "chain_eval_success", "tokens"):
    assert key in out, key
  assert out["tree_group"] == 8  # default: 2 x --group
  assert out["sessions_per_token_ratio"] > 1.0  # siblings share their prompt at least
  for key in ("tree", "tree_ms_grpo"):
    by_seed = np.array(out[f"{key}_eval_by_seed"])
    chains = np.array(out["chain_eval_by_seed"])
    assert by_seed.shape == chains.shape == (2,)
    d = by_seed - chains
    np.testing.assert_allclose(out[f"{key}_eval_diff"], d.mean(), atol=1e-4)
    np.testing.assert_allclose(out[f"{key}_eval_diff_se"], d.std(ddof=1) / np.sqrt(2), atol=1e-4)
    assert out[f"{key}_tokens"] >= 2500
    assert 0.0 <= out[f"{key}_eval_peek"] <= 1.0
  assert out["chain_tokens"] >= 2500
  assert "| trees_ms_grpo (ms_grpo) |" in p.stdout
