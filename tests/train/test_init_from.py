"""config.init_from: a warm start shared by many runs (the study's cells) starts each of them exactly."""
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from main_helpers import run_main
from mtrl_jax.metrics import read_metrics

STUDY = "configs/study.py:runlocal=true,probe=bifurcation,horizon=2"


def _policy(workdir):
  mgr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  out = mgr.restore(mgr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  leaves = {}

  def walk(t, p=""):
    if isinstance(t, dict):
      for k, v in t.items():
        walk(v, f"{p}/{k}")
    else:
      leaves[p] = np.asarray(t)
  walk(out.state["policy"])
  return leaves


@pytest.mark.slow
def test_runs_start_from_the_shared_warm_start(tmp_path):
  """A run with init_from starts from the warm start's policy, bit for bit, and skips demos and sft.

  The warm start has no critic; the run has a separate critic (a different checkpoint tree), and
  trains only the critic (stages value_pretrain), so its policy must equal the warm start's.
  Catches: init_from ignored (the run keeps its random init: every leaf differs), sft run again
  (the policy moves), a restore that needs equal trees (fails on the critic)."""
  warm, run, cold = (str(tmp_path / n) for n in ("warm", "run", "cold"))
  p = run_main(warm, config=f"{STUDY},stage=warm")
  assert p.returncode == 0, p.stderr[-3000:]
  args = ("--config.stages=('demos','sft','value_pretrain')",)
  p = run_main(run, f"--config.init_from={warm}", *args, config=f"{STUDY},arm=gae_decoupled")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "warm start: policy of" in p.stderr and "stage sft: already done" in p.stderr
  assert not [r for r in read_metrics(run) if r["stage"] == "sft"]  # no SFT step ran here
  w, r = _policy(warm), _policy(run)
  assert w.keys() == r.keys() and len(w) > 5
  for k in w:
    np.testing.assert_array_equal(w[k], r[k], err_msg=k)
  # The same run without the warm start: a different policy (so the comparison above can fail).
  p = run_main(cold, "--config.stages=('value_pretrain',)", config=f"{STUDY},arm=gae_decoupled")
  assert p.returncode == 0, p.stderr[-3000:]
  c = _policy(cold)
  assert sum(not np.array_equal(w[k], c[k]) for k in w) > len(w) // 2


def test_init_from_without_a_finished_sft_names_the_field(tmp_path):
  empty = tmp_path / "nothing"
  empty.mkdir()
  p = run_main(str(tmp_path / "run"), f"--config.init_from={empty}", config=f"{STUDY},arm=grpo", timeout=120)
  assert p.returncode != 0 and "config.init_from" in p.stderr, p.stderr[-2000:]
