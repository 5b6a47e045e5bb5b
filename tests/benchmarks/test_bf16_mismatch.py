"""benchmarks/bf16_mismatch.py at a tiny size, in process: its numbers, not just its exit code."""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bf16_mismatch  # noqa: E402


def test_fp32_agrees_to_float_noise_and_bf16_does_not(capsys):
  """Random tiny model, 2 sessions x 2 turns x 4 tokens. fp32: every generated
  token counted, ratios within float noise of 1 (share 0); bf16 weights stay
  fp32 and its gap is far above fp32's. Catches (checked by a temporary edit)
  scoring the sampled tokens one position off (behaviour log-probs not
  shifted with the targets: the fp32 gap becomes O(1))."""
  bf16_mismatch.main(["--tiny", "--sessions", "2", "--turns", "2", "--new", "4", "--obs", "4", "--prompt", "8"])
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  f32, b16 = out["results"]["float32"], out["results"]["bfloat16"]
  assert f32["tokens"] == b16["tokens"] == 2 * 2 * 4
  assert f32["share_outside"] == 0.0 and f32["logp_abs_max"] < 1e-5
  assert b16["param_dtype"] == "float32" and b16["logp_abs_mean"] > 10 * f32["logp_abs_mean"]
  assert out["band"] == [0.9, 1.1] and out["backend"] == "cpu"
