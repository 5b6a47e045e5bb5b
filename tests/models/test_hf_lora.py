"""LoRA and Hugging Face: a loaded checkpoint as the frozen base, the merged
export and the PEFT adapter folder, against transformers and peft as oracles."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from mtrl_jax.models import hf, lora  # noqa: E402
from test_hf import hf_logits, make_hf, tokens  # noqa: E402

LORA = {"rank": 4, "alpha": 8.0}


def ours(model, tok):
  return np.asarray(model(jnp.asarray(tok, jnp.int32))[0])


def randomize_b(model, seed=0, scale=0.3):
  rng = np.random.default_rng(seed)
  flat = []
  for path, var in nnx.to_flat_state(nnx.state(model, lora.ADAPTER)):
    if str(path[-1]).endswith(lora.B_SUFFIX):
      var = var.replace(jnp.asarray(scale * rng.standard_normal(var.get_value().shape), jnp.float32))
    flat.append((path, var))
  nnx.update(model, nnx.from_flat_state(flat))


@pytest.mark.parametrize("family, scan, targets", [("qwen2", False, ("all",)), ("llama", True, ("q", "v", "down"))])
def test_checkpoint_is_the_base_and_exports_match_transformers_and_peft(tmp_path, family, scan, targets):
  """load_policy with lora: the checkpoint's weights untouched, fresh adapters
  a no-op (logits equal the plain load exactly); after the adapters move,
  (1) export_policy writes merged weights that transformers runs as our
  adapted model, and (2) export_peft_adapter writes a folder that
  peft.PeftModel over the original checkpoint runs as our adapted model.

  The adapters move the logits by O(1) (asserted) against a 1e-4 tolerance.
  Break checked: lora_A / lora_B written untransposed, or lora_alpha written
  as alpha / rank, fails (2); export_policy without the merge fails (1).
  """
  hf_dir = make_hf(tmp_path, family, tie_word_embeddings=(family == "llama"))
  plain = hf.load_policy(hf_dir, scan_layers=scan)
  model = hf.load_policy(hf_dir, scan_layers=scan, lora={**LORA, "targets": targets}, lora_seed=3)
  tok = tokens(plain.cfg.vocab_size)
  np.testing.assert_array_equal(ours(model, tok), ours(plain, tok))
  base = {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(plain))}
  for p, v in nnx.to_flat_state(lora.base(nnx.state(model))):
    np.testing.assert_array_equal(np.asarray(v.get_value()), base[tuple(p)])

  randomize_b(model)
  want = ours(model, tok)
  assert np.abs(want - ours(plain, tok)).max() > 0.5

  merged_dir = str(tmp_path / "merged")
  hf.export_policy(model, merged_dir)
  np.testing.assert_allclose(hf_logits(merged_dir, tok), want, rtol=1e-4, atol=1e-4)

  adapter_dir = str(tmp_path / "adapter")
  cfg = hf.export_peft_adapter(model, adapter_dir, base_model_name_or_path=hf_dir)
  with open(os.path.join(adapter_dir, hf.PEFT_CONFIG_FILE)) as f:
    assert json.load(f) == cfg
  assert cfg["r"] == LORA["rank"] and cfg["lora_alpha"] == LORA["alpha"]
  base_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager",
                                                                 dtype=torch.float32)
  peft_model = peft.PeftModel.from_pretrained(base_model, adapter_dir)
  with torch.no_grad():
    got = peft_model(torch.as_tensor(np.asarray(tok), dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_peft_export_needs_adapters(tmp_path):
  model = hf.load_policy(make_hf(tmp_path, "llama"))
  with pytest.raises(ValueError, match="no LoRA adapters"):
    hf.export_peft_adapter(model, str(tmp_path / "a"))


def test_critic_trunk_import_leaves_its_adapters(tmp_path):
  from mtrl_jax.models.value import Critic
  hf_dir = make_hf(tmp_path, "qwen2")
  cfg = hf.load_policy(hf_dir, lora=LORA).cfg
  critic = Critic(cfg, rngs=nnx.Rngs(0))
  own = {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(critic, lora.ADAPTER))}
  hf.load_critic_trunk(hf_dir, critic)
  for p, v in nnx.to_flat_state(nnx.state(critic, lora.ADAPTER)):
    np.testing.assert_array_equal(np.asarray(v.get_value()), own[tuple(p)])
  plain = hf.load_policy(hf_dir)
  want = {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(plain))}
  got = {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(lora.base(nnx.state(critic.trunk)))}
  for k, v in got.items():
    np.testing.assert_array_equal(v, want[k])
