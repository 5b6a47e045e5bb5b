"""GGUF import of an untied model, and load_policy's refusal of a stray LM head
under a tied config (issue 34).

Every fixture of test_gguf_convert.py is tied (llama.cpp then writes no
`output.weight`), so a converter that declared every model tied passed there;
and load_policy accepted any extra `lm_head.weight` under a tied config, so
the untied model's LM head was silently replaced by the embedding.
"""
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from safetensors.numpy import load_file, save_file  # noqa: E402

from mtrl_jax.models import gguf_convert, hf, hf_check  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_fixtures  # noqa: E402


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def untied(request, tmp_path_factory):
  tmp = tmp_path_factory.mktemp(f"gguf_untied_{request.param}")
  path = gguf_fixtures.tiny_gguf(tmp, request.param, tie_word_embeddings=False)
  out = str(tmp / "hf")
  gguf_convert.convert(path, out, log=lambda _: None)
  return path, out


def test_untied_gguf_keeps_its_output_head_and_matches_transformers(untied):
  """An untied GGUF (it holds `output.weight`): the converted folder says
  tie_word_embeddings=false, its lm_head.weight is transformers' own
  dequantized LM head (not the embedding), and our logits equal transformers'
  from the same GGUF (max |diff| ~1e-6 x the logits' max).

  Bug caught (issue 34, checked on a scratch edit): gguf_convert.hf_config
  declaring `"tie_word_embeddings": True` for every file: the config
  assertion fails, and so would the logits (off by ~1x their max, the
  embedding standing in for the head) once the config check is removed;
  load_policy itself now refuses that folder (next test).
  """
  path, out = untied
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["tie_word_embeddings"] is False
  folder, name = os.path.split(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                            attn_implementation="eager")
  assert model.config.tie_word_embeddings is False
  got = load_file(os.path.join(out, "model.safetensors"))
  head = model.state_dict()["lm_head.weight"].numpy()
  np.testing.assert_array_equal(got["lm_head.weight"], head)
  assert np.abs(head - got["model.embed_tokens.weight"]).max() > 0.1  # really untied

  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 11))
  with torch.no_grad():
    want = model(torch.as_tensor(tokens)).logits.numpy()
  ours = hf_check.full_logits(hf.load_policy(out), tokens)
  assert np.abs(want).max() > 1.0
  np.testing.assert_allclose(ours, want, rtol=0, atol=5e-5 * np.abs(want).max())


def _declare_tied(out: str) -> None:
  cfg_path = os.path.join(out, "config.json")
  with open(cfg_path) as f:
    cfg = json.load(f)
  cfg["tie_word_embeddings"] = True
  with open(cfg_path, "w") as f:
    json.dump(cfg, f)


def test_load_policy_refuses_a_different_lm_head_under_a_tied_config(untied, tmp_path):
  """A folder whose config says tied but which stores an lm_head.weight that is
  not the embedding: load_policy raises, naming the tensor. The same folder
  with lm_head.weight = the embedding (how some tied checkpoints are saved)
  loads, and its logits equal those of the folder without the copy.

  Bug caught (checked on a scratch edit): `allowed_extra=("lm_head.weight",)
  if cfg.tie_embeddings` (the old rule, any extra head accepted under a tie):
  no error is raised and the pytest.raises fails.
  """
  import shutil
  _, out = untied
  bad = str(tmp_path / "bad")
  shutil.copytree(out, bad)
  _declare_tied(bad)
  with pytest.raises(ValueError, match="lm_head.weight"):
    hf.load_policy(bad)

  # The benign case: a tied checkpoint that also stores its embedding as lm_head.weight.
  copy, plain = str(tmp_path / "copy"), str(tmp_path / "plain")
  for d in (copy, plain):
    shutil.copytree(out, d)
    _declare_tied(d)
  st = os.path.join(copy, "model.safetensors")
  tensors = load_file(st)
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
  save_file(tensors, st, metadata={"format": "pt"})
  st = os.path.join(plain, "model.safetensors")
  tensors = load_file(st)
  del tensors["lm_head.weight"]
  save_file(tensors, st, metadata={"format": "pt"})
  tokens = np.random.default_rng(1).integers(0, 200, (1, 7))
  np.testing.assert_array_equal(hf_check.full_logits(hf.load_policy(copy), tokens),
                                hf_check.full_logits(hf.load_policy(plain), tokens))
