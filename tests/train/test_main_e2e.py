"""The real entry point end to end, its resume, and its failure modes."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from main_helpers import ROOT, env_one_device, main_cmd, run_main, shared_compile_cache
from mtrl_jax.metrics import read_metrics


def _final_state(workdir):
  mgr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  step = mgr.latest_step()
  out = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return out.state


def _flat(tree, prefix=""):
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}/{k}"))
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      out.update(_flat(v, f"{prefix}/{i}"))
  else:
    out[prefix] = np.asarray(tree)
  return out


@pytest.mark.slow
def test_main_job_runs_every_stage(tmp_path):
  proc = run_main(str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert "final/eval/success" in summary
  recs = read_metrics(str(tmp_path))
  stages = {r["stage"] for r in recs}
  assert {"demos", "sft", "rl", "eval"} <= stages
  rl = [r for r in recs if r["stage"] == "rl" and "ledger/tokens_generated" in r]
  assert len(rl) == 3  # config.rl.steps
  for r in rl:
    # The synchronous source reports 0; the learner measures the staleness from
    # the versions recorded on the tokens it trains on (a sampler left on old
    # weights by the RL loop would show here).
    assert r["ledger/tokens_generated"] > 0 and r["staleness/max"] == r["update/staleness_max"] == 0.0
    assert 0.0 <= r["rollout/success"] <= 1.0
  assert any("eval/success" in r for r in recs if r["stage"] == "rl")
  # Relaunching a finished run does no work and changes nothing.
  before = _flat(_final_state(str(tmp_path)))
  again = run_main(str(tmp_path))
  assert again.returncode == 0, again.stderr[-2000:]
  assert "already done" in again.stderr
  after = _flat(_final_state(str(tmp_path)))
  assert before.keys() == after.keys()
  assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
  extra = ["--config.rl.steps=6", "--config.eval.every=100", "--config.checkpoint.async_save=false",
           shared_compile_cache(tmp_path / "jax_cache")]
  ref_dir, kill_dir = str(tmp_path / "ref"), str(tmp_path / "killed")
  ref = run_main(ref_dir, *extra)
  assert ref.returncode == 0, ref.stderr[-3000:]

  proc = subprocess.Popen(main_cmd(kill_dir, *extra), cwd=ROOT, env=env_one_device(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  killed_at = None
  while time.time() < deadline and proc.poll() is None:
    rl = [r["step"] for r in read_metrics(kill_dir) if r["stage"] == "rl" and "ledger/tokens_generated" in r]
    if rl and max(rl) >= 3:
      proc.send_signal(signal.SIGKILL)
      killed_at = max(rl)
      break
    time.sleep(0.2)
  proc.wait(timeout=30)
  assert killed_at is not None, "the run ended or stalled before reaching RL step 3"

  resumed = run_main(kill_dir, *extra)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from checkpoint" in resumed.stderr
  a, b = _flat(_final_state(ref_dir)), _flat(_final_state(kill_dir))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("override, field", [
    ("--config.rl.lr=fast", "rl.lr"),
    ("--config.rl.estimatr=gae", "estimatr"),
    ("--config.rl.estimator=gea", "rl.estimator"),
    ("--config.mesh.shape=(3,1,1)", "config.mesh.shape"),
    ("--config.rl.minibatches=3", "rl.minibatches"),
    ("--config.env.kwargs.lenght=3", "lenght"),
])
def test_bad_override_fails_before_compute_naming_the_field(tmp_path, override, field):
  proc = run_main(str(tmp_path), override, timeout=120)
  assert proc.returncode != 0
  assert field in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


@pytest.mark.slow
def test_nonfinite_loss_is_skipped_then_stops(tmp_path):
  proc = run_main(str(tmp_path), "--config.stages=('sft','rl')", "--config.debug.nan_at_updates=(1,2,3)",
                  "--config.rl.max_nonfinite=3", "--config.rl.steps=6")
  assert proc.returncode == 3, proc.stderr[-3000:]
  assert "non-finite" in proc.stderr and "config.rl.max_nonfinite" in proc.stderr
  rl = [r for r in read_metrics(str(tmp_path)) if r["stage"] == "rl" and "update/nonfinite_steps" in r]
  assert [r["update/nonfinite_steps"] > 0 for r in rl] == [False, True, True]
  assert rl[-1]["update/nonfinite_total"] >= 2


@pytest.mark.slow
def test_ppo_family_pretrains_the_critic_then_trains_with_gae(tmp_path):
  proc = run_main(str(tmp_path), "--config.stages=('demos','sft','value_pretrain','rl')",
                  config="configs/ppo.py:runlocal=true,estimator=gae,adaptive=true")
  assert proc.returncode == 0, proc.stderr[-3000:]
  recs = read_metrics(str(tmp_path))
  vp = [r for r in recs if r["stage"] == "value_pretrain"]
  rounds = [r for r in vp if "value_pretrain/final" not in r]
  assert rounds and all("value_pretrain/explained_variance" in r and r["value_pretrain/fit_loss"] >= 0
                        for r in rounds)
  final = [r for r in vp if "value_pretrain/final" in r]
  assert len(final) == 1 and np.isfinite(final[0]["value_pretrain/explained_variance"])
  rl = [r for r in recs if r["stage"] == "rl" and "explained_variance" in r]
  assert len(rl) == 3 and all(np.isfinite(r["value_loss"]) for r in rl)
  # The policy stayed frozen while the critic was fitted: RL starts at version 0.
  assert [r["policy_version"] for r in rl] == [1, 2, 3]
