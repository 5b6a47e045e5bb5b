"""configs/smol.py wired through train/run.py with the real SmolLM2 checkpoint.

Quick: the 2-block slice (real tokenizer, template, vocabulary). Slow: all 30
blocks through one RL update.
"""
import json
import os

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from mtrl_jax.train.scoring import sampler_mismatch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _smol(hf_dir, env="memory", **over):
  import sys
  sys.path.insert(0, ROOT)
  from configs.smol import get_config
  c = get_config(f"hf_dir={hf_dir},runlocal=true,env={env}")
  c.checkpoint.async_save = False
  c.sft.batch_size = 8  # tests run on 8 fake devices
  for k, v in over.items():
    node = c
    *head, last = k.split(".")
    for h in head:
      node = node[h]
    node[last] = v
  return c


def test_sampler_mismatch_counts_current_version_action_tokens_only():
  """Hand-worked: only masked tokens of version 3 count (the 0.5 gap is a
  version-2 token, the 9.0 gap an observation token)."""
  prox = np.array([[0.0, -1.0, -2.0, -3.0], [-1.0, -1.0, -1.0, 0.0]])
  behav = np.array([[9.0, -1.1, -2.0, -2.5], [-1.3, -1.0, -1.0, 0.0]])
  mask = np.array([[0, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  version = np.array([[-1, 3, 3, 2], [3, 3, -1, -1]])
  out = sampler_mismatch(prox, behav, mask, version, 3)
  gaps = [0.1, 0.0, 0.3, 0.0]
  assert out["mismatch/tokens"] == 4
  assert out["mismatch/logp_abs_mean"] == pytest.approx(np.mean(gaps))
  assert out["mismatch/logp_abs_max"] == pytest.approx(0.3)
  assert out["mismatch/ratio_out_share"] == pytest.approx(2 / 4)  # gaps 0.1, 0.3 leave [0.9, 1.1]
  assert sampler_mismatch(prox, behav, mask, version, 7) == {
      "mismatch/logp_abs_mean": 0.0, "mismatch/logp_abs_max": 0.0, "mismatch/ratio_out_share": 0.0,
      "mismatch/tokens": 0.0}


def test_config_json_records_the_model_that_ran(smollm2_2layer, tmp_path):
  """Issue 22: config.json said vocab 264 / byte model while SmolLM2 ran.
  Break checked: run.py dumping config.model as given."""
  from mtrl_jax.train.run import Run
  c = _smol(smollm2_2layer, stages=())
  run = Run(c, str(tmp_path))
  rec = json.load(open(tmp_path / "config.json"))
  assert rec["model"]["vocab_size"] == 49152 and rec["model"]["n_layers"] == 2 and rec["model"]["dim"] == 576
  assert rec["model"]["source"] == smollm2_2layer and rec["model"]["remat"] == c.model.remat
  assert run.sampler.stop_ids == run.tok.stop_ids == (2,)  # from generation_config.json
  assert run.tok.has_own_template


@pytest.mark.slow
def test_full_model_through_one_rl_update(smollm2_full, tmp_path):
  """All 30 blocks of SmolLM2-135M-Instruct through the real entry point (one
  device): load, sample with the chat template, one RL update with finite
  metrics and an fp32 trainer/sampler gap at float noise."""
  from main_helpers import ROOT as MAIN_ROOT, env_one_device
  import subprocess
  import sys
  cmd = [sys.executable, "-m", "mtrl_jax.main", f"--config=configs/smol.py:hf_dir={smollm2_full},env=bifurcation",
         f"--workdir={tmp_path}", "--config.stages=('rl',)", "--config.rl.steps=1",
         "--config.rl.tasks_per_update=2", "--config.rl.group_size=4", "--config.rl.minibatches=1",
         "--config.eval.tasks=2", "--config.eval.every=100", "--config.log.tensorboard=False"]
  proc = subprocess.run(cmd, cwd=MAIN_ROOT, env=env_one_device(), capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rec = json.load(open(tmp_path / "config.json"))
  assert rec["model"]["n_layers"] == 30 and rec["model"]["vocab_size"] == 49152
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  m = [r for r in rows if r.get("stage") == "rl" and "mismatch/tokens" in r][-1]
  assert m["mismatch/tokens"] > 0 and m["mismatch/logp_abs_max"] < 1e-3
  assert np.isfinite(m["total_loss"]) and m["update/nonfinite_steps"] == 0 and m["policy_version"] == 1
