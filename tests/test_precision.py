"""The precision switch (models/config.py resolve_precision, `model.dtype="auto"`):
bf16 compute with fp32 weights and optimiser state on GPU/TPU, fp32 on CPU.

The platform is passed (or stood in) explicitly, so the accelerator defaults
are checked on this CPU.
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mtrl_jax import config as config_lib
from mtrl_jax.models import config as model_config
from mtrl_jax.models.config import RUNTIME_FIELDS, ModelConfig, resolve_precision
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.train import optim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("platform,want", [("gpu", "bfloat16"), ("tpu", "bfloat16"), ("cpu", "float32")])
def test_auto_resolves_per_platform(platform, want):
  """auto: bf16 compute on accelerators, fp32 on CPU; weights fp32 everywhere;
  an explicit dtype is kept on every platform. Catches (checked by a temporary
  edit) "auto" resolving to bf16 on CPU, or param_dtype "auto" following the
  compute dtype (bf16 master weights)."""
  assert resolve_precision("auto", "float32", platform) == (want, "float32")
  assert resolve_precision("auto", "auto", platform) == (want, "float32")
  for explicit in ("float32", "bfloat16", "float16"):
    assert resolve_precision(explicit, "float32", platform) == (explicit, "float32")
  assert resolve_precision("bfloat16", "bfloat16", platform) == ("bfloat16", "bfloat16")


def _get_config(name, arg=None):
  sys.path.insert(0, ROOT)
  import importlib
  return importlib.import_module(f"configs.{name}").get_config(arg)


def test_real_model_configs_default_to_auto_and_default_stays_fp32():
  """configs/smol.py and configs/scale.py say "auto" (bf16 on accelerators) with
  fp32 weights; configs/default.py (CPU byte model) is float32/float32 as before,
  and on this CPU "auto" builds the fp32 model the smol job always ran."""
  for name in ("smol", "scale"):
    c = _get_config(name)
    assert (c.model.dtype, c.model.param_dtype) == ("auto", "float32"), name
  d = _get_config("default")
  assert (d.model.dtype, d.model.param_dtype) == ("float32", "float32")
  mc = ModelConfig.from_dict(_get_config("scale").model)
  assert jax.default_backend() == "cpu" and (mc.dtype, mc.param_dtype) == ("float32", "float32")


def test_bad_precision_names_the_field():
  c = _get_config("default")
  c.model.dtype = "bf16"
  with pytest.raises(ValueError, match=r"config.model: ModelConfig.dtype='bf16'.*auto"):
    config_lib.validate(c)
  c.model.dtype, c.model.param_dtype = "auto", "fp8"
  with pytest.raises(ValueError, match=r"config.model: ModelConfig.param_dtype='fp8'"):
    config_lib.validate(c)


def test_checkpoint_dtype_does_not_set_master_weights():
  """With an HF folder (train/run.py: the checkpoint's config + our runtime
  fields), `--config.model.dtype=bfloat16` keeps config.model.param_dtype
  (float32) for the weights; hf.config_from_hf alone would store them in bf16.
  Catches (checked) param_dtype missing from RUNTIME_FIELDS."""
  from mtrl_jax.models.hf import config_from_hf
  hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "rope_theta": 1e4,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
  c = _get_config("smol")
  c.model.dtype = "bfloat16"
  got = dataclasses.replace(config_from_hf(hf, dtype=c.model.dtype), **{k: c.model[k] for k in RUNTIME_FIELDS})
  assert (got.dtype, got.param_dtype) == ("bfloat16", "float32")


def test_auto_on_gpu_trains_bf16_with_fp32_weights_and_adam_state(monkeypatch):
  """On a (stood-in) GPU platform a ModelConfig with dtype "auto" computes in
  bf16 (hidden states), keeps fp32 parameters, fp32 Adam moments, and one
  optimiser step leaves every parameter fp32 and changed.
  Catches (checked) "auto" resolving to fp32 on GPU."""
  monkeypatch.setattr(model_config, "_platform", lambda: "gpu")
  cfg = ModelConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=24,
                    dtype="auto", param_dtype="auto", attention="xla")
  assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
  _check_bf16_compute_fp32_state(Transformer(cfg, rngs=nnx.Rngs(0)), vocab=32)


# The shape of a test model; every other field (dtype "auto", param_dtype "float32", attention,
# scan_layers, remat, logits_chunk, lora) is the config's own.
TINY = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48)


def _smol_policy(c, tmp_path):
  """configs/smol.py's path (train/run.py): the HF folder's shape, `load_policy(dtype=model.dtype,
  **the runtime fields of config.model)`; here a tiny fp32 folder exported for the test."""
  from mtrl_jax.models.hf import export_policy, load_policy
  export_policy(Transformer(ModelConfig(**TINY), rngs=nnx.Rngs(1)), str(tmp_path))
  return load_policy(str(tmp_path), dtype=c.model.dtype, **{k: c.model[k] for k in RUNTIME_FIELDS})


def _scale_policy(c, tmp_path):
  """configs/scale.py's path (no HF folder): ModelConfig.from_dict(config.model), shape shrunk."""
  return Transformer(ModelConfig.from_dict({**dict(c.model), **TINY}), rngs=nnx.Rngs(1))


@pytest.mark.parametrize("name,build", [("smol", _smol_policy), ("scale", _scale_policy)])
def test_real_model_configs_on_a_stood_in_gpu_compute_bf16_and_keep_fp32_state(name, build, monkeypatch,
                                                                                tmp_path):
  """The smol and scale configs' own case: dtype "auto" with param_dtype "float32" given, built by
  the config's own path while `jax.default_backend()` (what the precision switch reads) says "gpu":
  bf16 hidden states, fp32 parameters and Adam moments, every parameter fp32 after a step.
  The backend is stood in only while the model is built, so the forward runs on this CPU's kernels.
  Breaks checked: "auto" resolved only when both fields say "auto" (scale fails: its
  ModelConfig.dtype='auto' is refused; smol's HF path passes "auto" for both); the platform read
  from `jax.devices("cpu")` instead of the default backend (both fail: fp32 compute; the test above,
  which stands in `_platform` itself, passes); `load_policy` storing the weights in the compute dtype
  (`_place(arr, var, cfg.compute_dtype)` in models/hf.py: smol fails on bf16 parameters)."""
  c = _get_config(name)
  assert (c.model.dtype, c.model.param_dtype) == ("auto", "float32")
  with monkeypatch.context() as m:
    m.setattr(jax, "default_backend", lambda: "gpu")
    model = build(c, tmp_path)
  assert (model.cfg.dtype, model.cfg.param_dtype) == ("bfloat16", "float32")
  assert model.cfg.scan_layers == c.model.scan_layers and model.cfg.remat == c.model.remat
  _check_bf16_compute_fp32_state(model, vocab=TINY["vocab_size"])


def _check_bf16_compute_fp32_state(model, vocab: int) -> None:
  """Hidden states bf16; parameters, Adam state and the stepped parameters fp32; the step moves them.
  Jitted (two programs): op-by-op, the forward, backward and Adam update cost ~4x the CPU time."""
  graphdef, params = nnx.split(model, nnx.Param)
  tokens = jnp.asarray(np.arange(10).reshape(1, 10) % vocab)
  h = jax.jit(lambda p: nnx.merge(graphdef, p).hidden(tokens)[0])(params)
  assert h.dtype == jnp.bfloat16

  def loss(p):
    logits, _ = nnx.merge(graphdef, p)(tokens)
    return jnp.mean(jax.nn.logsumexp(logits.astype(jnp.float32), -1))

  tx = optim.adamw(1e-2, total_steps=10)

  @jax.jit
  def step(p):
    state = tx.init(p)
    updates, state = tx.update(jax.grad(loss)(p), state, p)
    return state, optax.apply_updates(p, updates)

  state, new = step(params)
  leaves = lambda tree: [x for x in jax.tree.leaves(tree) if hasattr(x, "dtype") and x.ndim > 0]
  assert all(x.dtype == jnp.float32 for x in leaves(params))
  assert all(x.dtype == jnp.float32 for x in leaves(state))  # Adam mu and nu
  assert all(x.dtype == jnp.float32 for x in leaves(new))
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(leaves(params), leaves(new)))


def test_bf16_logits_accumulate_in_fp32():
  """project_logits on bf16 hidden states and weights: the logits are the fp32
  product of the bf16 values, not a bf16-rounded result (bf16 keeps 8 bits: a
  logit of 20 would move by up to 0.06, which both sides of the trainer/sampler
  comparison then round differently: 4.4% of SmolLM2's bf16 ratios left
  [0.9, 1.1] on CPU before, 0.3% after; benchmarks/RESULTS.md).
  Catches (checked) dropping preferred_element_type=float32 from the einsum."""
  from mtrl_jax.models.transformer import project_logits
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.standard_normal((2, 3, 64)) * 2, jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((64, 50)), jnp.bfloat16)
  got = np.asarray(project_logits(h, w), np.float64)
  want = np.einsum("btd,dv->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
  assert np.abs(want).max() > 20
  np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())
