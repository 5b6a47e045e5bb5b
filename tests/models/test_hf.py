"""HF import against transformers as the oracle (tiny random models, offline)."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402

from mtrl_jax.models import hf, hf_check  # noqa: E402
from mtrl_jax.models.config import ModelConfig  # noqa: E402
from mtrl_jax.models.transformer import Transformer  # noqa: E402
from mtrl_jax.models.value import Critic  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (family, overrides): head counts, GQA ratios 1/2/4, rope bases, tied and
# untied embeddings, head_dim both default and != hidden/heads.
SHAPES = {
    "llama_mha_untied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, rope_theta=10_000.0,
                                       tie_word_embeddings=False)),
    "llama_gqa2_tied_hd12": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                           rope_theta=500.0, tie_word_embeddings=True)),
    "qwen2_gqa4_untied": ("qwen2", dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=1e6,
                                        tie_word_embeddings=False)),
    "qwen2_gqa2_tied_hd10": ("qwen2", dict(num_attention_heads=2, num_key_value_heads=1, head_dim=10,
                                           rope_theta=2_000.0, tie_word_embeddings=True)),
}


def make_hf(tmp_path, family: str, seed: int = 0, max_shard_size=None, dtype=None, **overrides) -> str:
  """Saves a tiny random HF model whose every weight (norms, biases too) is non-trivial."""
  kw = dict(vocab_size=89, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            # std 0.02 gives near-uniform logits and fragile greedy ties.
            initializer_range=0.2, attn_implementation="eager")
  kw.update(overrides)
  torch.manual_seed(seed)
  if family == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  else:
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
  if dtype is not None:
    model = model.to(dtype)
  out = str(tmp_path / f"{family}_{seed}")
  model.save_pretrained(out, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
  return out


def hf_logits(hf_dir, tokens_bt):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dir, attn_implementation="eager", dtype=torch.float32)
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(tokens_bt), dtype=torch.long)).logits.numpy()


def tokens(vocab, b=2, t=11, seed=1):
  return np.random.default_rng(seed).integers(0, vocab, (b, t))


def params_of(model):
  return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


# ---- config mapping -------------------------------------------------------

def test_config_from_hf_maps_every_field():
  hf_cfg = transformers.Qwen2Config(
      vocab_size=77, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
      num_key_value_heads=2, rope_theta=12_345.0, rms_norm_eps=3e-6, tie_word_embeddings=True).to_dict()
  hf_cfg["architectures"] = ["Qwen2ForCausalLM"]
  cfg = hf.config_from_hf(hf_cfg, dtype="bfloat16")
  assert cfg == ModelConfig(vocab_size=77, dim=48, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=8,
                            mlp_dim=96, rope_theta=12_345.0, norm_eps=3e-6, qkv_bias=True,
                            tie_embeddings=True, dtype="bfloat16", param_dtype="bfloat16")


def test_config_from_hf_reads_legacy_rope_and_defaults():
  legacy = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 40,
            "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 50, "rope_theta": 321.0,
            "rope_scaling": None, "rms_norm_eps": 1e-5}
  cfg = hf.config_from_hf(legacy)
  assert (cfg.rope_theta, cfg.n_kv_heads, cfg.head_dim, cfg.qkv_bias, cfg.tie_embeddings) == (
      321.0, 4, 8, False, False)


@pytest.mark.parametrize("field,value", [
    ("rope_scaling", {"type": "linear", "factor": 2.0}),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
])
def test_scaled_rope_is_rejected(field, value):
  base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 40,
          "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 50}
  with pytest.raises(ValueError, match=f"{field}.rope_type"):
    hf.config_from_hf({**base, field: value})


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "GPT2LMHeadModel"])
def test_unsupported_architecture_is_named(tmp_path, arch):
  (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "hidden_size": 8}))
  with pytest.raises(ValueError, match=arch) as err:
    hf.load_policy(str(tmp_path))
  assert "LlamaForCausalLM" in str(err.value) and "Qwen2ForCausalLM" in str(err.value)


def test_unsupported_features_name_their_field():
  base = {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 50}
  with pytest.raises(ValueError, match="use_sliding_window"):
    hf.config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"],
                       "layer_types": ["full_attention", "sliding_attention"]})
  with pytest.raises(ValueError, match="use_sliding_window"):  # the pre-layer_types spelling
    hf.config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                       "sliding_window": 4096, "max_window_layers": 1})
  # A window that starts past the last layer slides nowhere: accepted.
  assert hf.config_from_hf({**base, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                            "sliding_window": 4096, "max_window_layers": 2}).qkv_bias
  with pytest.raises(ValueError, match="attention_bias"):
    hf.config_from_hf({**base, "architectures": ["LlamaForCausalLM"], "attention_bias": True})
  with pytest.raises(ValueError, match="hidden_act"):
    hf.config_from_hf({**base, "architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"})


# ---- weights --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SHAPES))
def test_logits_and_greedy_match_transformers(tmp_path, name):
  family, overrides = SHAPES[name]
  hf_dir = make_hf(tmp_path, family, **overrides)
  info, r = hf_check.compare(hf_dir, batch=2, length=12, n_new=16)
  assert info["arch"] == ("LlamaForCausalLM" if family == "llama" else "Qwen2ForCausalLM")
  assert info["n_kv_heads"] == overrides["num_key_value_heads"]
  assert info["tie_embeddings"] == overrides["tie_word_embeddings"]
  assert r.max_abs_logit > 1.0  # the comparison is not between near-zero logits
  assert r.max_abs_logit_diff <= 1e-4
  assert r.greedy_match and r.greedy_first_mismatch == -1
  assert len(np.unique(r.theirs_bn)) > 1  # a continuation worth comparing


def test_sharded_checkpoint_with_index(tmp_path):
  hf_dir = make_hf(tmp_path, "qwen2", max_shard_size="20KB")
  shards = [f for f in os.listdir(hf_dir) if f.startswith("model-") and f.endswith(".safetensors")]
  assert len(shards) > 1 and os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json"))
  tok = tokens(89)
  logits, _ = hf.load_policy(hf_dir)(jnp.asarray(tok))
  np.testing.assert_allclose(np.asarray(logits), hf_logits(hf_dir, tok), atol=1e-4)


def test_bf16_checkpoint_loads_exactly(tmp_path):
  hf_dir16 = make_hf(tmp_path / "bf16", "llama", dtype=torch.bfloat16, tie_word_embeddings=False)
  sample = load_file(os.path.join(hf_dir16, "model.safetensors"))
  assert sample["model.embed_tokens.weight"].dtype.name == "bfloat16"
  model = hf.load_policy(hf_dir16)
  want = sample["model.layers.1.self_attn.o_proj.weight"].astype(np.float32)
  np.testing.assert_array_equal(np.asarray(model.layers[1].attn.wo[...]).reshape(-1, 32), want.T)
  tok = tokens(89)
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(tok))[0]), hf_logits(hf_dir16, tok), atol=1e-4)

  model16 = hf.load_policy(hf_dir16, dtype="bfloat16")
  assert model16.embed[...].dtype == jnp.bfloat16
  logits16 = np.asarray(model16(jnp.asarray(tok))[0])
  assert np.all(np.isfinite(logits16)) and np.max(np.abs(logits16 - hf_logits(hf_dir16, tok))) < 0.25


def test_missing_tensor_is_named(tmp_path):
  hf_dir = make_hf(tmp_path, "llama")
  path = os.path.join(hf_dir, "model.safetensors")
  tensors = load_file(path)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, path, metadata={"format": "pt"})
  with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
    hf.load_policy(hf_dir)


def test_wrong_shape_and_unknown_tensor_are_named(tmp_path):
  hf_dir = make_hf(tmp_path, "llama")
  path = os.path.join(hf_dir, "model.safetensors")
  tensors = load_file(path)
  tensors["model.layers.0.mlp.gate_proj.bias"] = np.zeros(40, np.float32)
  save_file(tensors, path, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"mlp\.gate_proj\.bias"):
    hf.load_policy(hf_dir)
  del tensors["model.layers.0.mlp.gate_proj.bias"]
  tensors["model.norm.weight"] = np.ones(31, np.float32)
  save_file(tensors, path, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"model\.norm\.weight.*\(31,\)"):
    hf.load_policy(hf_dir)


def test_critic_trunk_import(tmp_path):
  hf_dir = make_hf(tmp_path, "qwen2", tie_word_embeddings=False)
  policy = hf.load_policy(hf_dir)
  critic = Critic(policy.cfg, rngs=nnx.Rngs(3))
  hf.load_critic_trunk(hf_dir, critic)
  tok = jnp.asarray(tokens(89))
  np.testing.assert_array_equal(np.asarray(critic.trunk.hidden(tok)[0]), np.asarray(policy.hidden(tok)[0]))
  np.testing.assert_array_equal(np.asarray(critic(tok)), np.zeros(tok.shape, np.float32))

  wrong = Critic(ModelConfig(vocab_size=89, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=8,
                             mlp_dim=40, qkv_bias=True), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="n_kv_heads"):
    hf.load_critic_trunk(hf_dir, wrong)


def test_load_inside_a_mesh_shards_the_weights(tmp_path):
  hf_dir = make_hf(tmp_path, "llama", tie_word_embeddings=False)
  plain = hf.load_policy(hf_dir)
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rules = (("batch", "data"), ("embed", "fsdp"), ("vocab", None), ("mlp", None), ("heads", None),
           ("kv_heads", None), ("head_dim", None), ("length", None))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    sharded = hf.load_policy(hf_dir)
  assert sharded.embed[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharded.layers[0].mlp.w_down[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
  want = params_of(plain)
  for path, value in params_of(sharded).items():
    np.testing.assert_array_equal(value, want[path])


@pytest.mark.parametrize("qkv_bias,tied", [(False, True), (True, False)])
def test_export_round_trips_through_transformers(tmp_path, qkv_bias, tied):
  cfg = ModelConfig(vocab_size=70, dim=24, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=6, mlp_dim=36,
                    rope_theta=777.0, norm_eps=1e-5, qkv_bias=qkv_bias, tie_embeddings=tied)
  model = Transformer(cfg, rngs=nnx.Rngs(7))
  # Redraw every weight (zero biases, unit norms and a 0.02 init would hide layout bugs).
  rng = np.random.default_rng(0)
  state = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(state):
    shape = var.get_value().shape
    base = 1.0 if path[-1] == "scale" else 0.0
    var.set_value(jnp.asarray(base + 0.2 * rng.standard_normal(shape), jnp.float32))
  nnx.update(model, state)
  out = str(tmp_path / "export")
  hf.export_policy(model, out)
  tok = tokens(70)
  np.testing.assert_allclose(hf_logits(out, tok), np.asarray(model(jnp.asarray(tok))[0]), atol=1e-4)
  back = hf.load_policy(out)
  assert back.cfg == cfg
  want = params_of(model)
  for path, value in params_of(back).items():
    np.testing.assert_array_equal(value, want[path])


# ---- the CLI --------------------------------------------------------------

def test_cli_prints_json_and_exits_zero(tmp_path):
  hf_dir = make_hf(tmp_path, "qwen2", max_shard_size="20KB", num_attention_heads=4, num_key_value_heads=1)
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-m", "mtrl_jax.models.hf", "check", "--hf_dir", hf_dir],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
  report = json.loads(line)
  assert report["arch"] == "Qwen2ForCausalLM" and report["n_kv_heads"] == 1
  assert (report["batch"], report["length"], report["new_tokens"]) == (2, 24, 32)
  assert report["max_abs_logit_diff"] <= 1e-4 and report["greedy_match"] is True


def test_cli_exits_one_when_a_check_fails(tmp_path, capsys, monkeypatch):
  """Exit status logic alone: compare() is replaced by results just past each limit.

  The logit bound is relative (issue 22: 30 float32 layers differ by 1.8e-4
  on logits of 33, 5.5e-6 relative, and must pass); --atol adds an absolute
  one. Break checked: the old absolute 1e-4 default fails the 33-scale case.
  """
  hf_dir = make_hf(tmp_path, "llama")
  info = hf_check._describe(hf.config_from_hf(hf.read_hf_config(hf_dir)), hf_dir)
  toks = np.zeros((2, 32), np.int64)
  good = hf_check.CheckResult(0.0, 3.0, True, -1, toks, toks)

  def run(result, *extra):
    monkeypatch.setattr(hf_check, "compare", lambda *a, **k: (info, result))
    code = hf_check.main(["check", "--hf_dir", hf_dir, *extra])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

  deep = good._replace(max_abs_logit_diff=1.83e-4, max_abs_logit=33.0)
  code, report = run(deep)
  assert code == 0 and report["ok"] and report["max_rel_logit_diff"] == pytest.approx(1.83e-4 / 33)
  assert report["max_abs_logit_diff"] == 1.83e-4  # the absolute figure is printed too
  for bad, extra in ((good._replace(max_abs_logit_diff=3.0 * 5e-5 * 1.01), ()),
                     (good._replace(greedy_match=False, greedy_first_mismatch=3), ()),
                     (deep, ("--atol", "1e-4")), (deep, ("--rtol", "5e-6"))):
    code, report = run(bad, *extra)
    assert code == 1 and report["ok"] is False and report["arch"] == "LlamaForCausalLM"


def test_greedy_check_runs_past_eos(tmp_path):
  hf_dir = make_hf(tmp_path, "llama", tie_word_embeddings=False)
  eos = transformers.AutoConfig.from_pretrained(hf_dir).eos_token_id
  path = os.path.join(hf_dir, "model.safetensors")
  tensors = load_file(path)
  tensors["lm_head.weight"][eos] *= 20.0  # eos becomes the argmax at many steps
  save_file(tensors, path, metadata={"format": "pt"})
  _, r = hf_check.compare(hf_dir, length=8, n_new=6)
  assert r.theirs_bn.shape == (2, 6) and (r.theirs_bn == eos).any()
  assert r.greedy_match


# ---- the scanned block layout (ModelConfig.scan_layers) -------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_gqa2_tied_hd12", "qwen2_gqa4_untied"])
def test_scanned_import_matches_transformers(tmp_path, name):
  """Per-layer HF tensors stacked into the layer axis: row i is layer i.
  Catches a wrong stacking order (logits then differ by O(1))."""
  family, overrides = SHAPES[name]
  hf_dir = make_hf(tmp_path, family, num_hidden_layers=3, **overrides)
  info, r = hf_check.compare(hf_dir, batch=2, length=12, n_new=16, scan_layers=True)
  assert info["n_layers"] == 3
  assert r.max_abs_logit > 1.0
  assert r.max_abs_logit_diff <= 1e-4
  assert r.greedy_match and len(np.unique(r.theirs_bn)) > 1
  model = hf.load_policy(hf_dir, scan_layers=True)
  assert model.cfg.scan_layers
  sample = load_file(os.path.join(hf_dir, "model.safetensors"))
  want = sample["model.layers.2.mlp.down_proj.weight"]
  np.testing.assert_array_equal(np.asarray(model.layers.mlp.w_down[...][2]), want.T)


@pytest.mark.parametrize("qkv_bias,tied", [(True, False)])
def test_scanned_export_round_trips_through_transformers(tmp_path, qkv_bias, tied):
  """A scanned model exports one HF tensor per layer (unstacked in order) and
  loads back, scanned or unrolled, to the same arrays."""
  cfg = ModelConfig(vocab_size=70, dim=24, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=6, mlp_dim=36,
                    rope_theta=777.0, norm_eps=1e-5, qkv_bias=qkv_bias, tie_embeddings=tied, scan_layers=True)
  model = Transformer(cfg, rngs=nnx.Rngs(7))
  rng = np.random.default_rng(0)
  state = nnx.state(model, nnx.Param)
  for path, var in nnx.to_flat_state(state):
    shape = var.get_value().shape
    base = 1.0 if path[-1] == "scale" else 0.0
    var.set_value(jnp.asarray(base + 0.2 * rng.standard_normal(shape), jnp.float32))
  nnx.update(model, state)
  out = str(tmp_path / "export")
  hf.export_policy(model, out)
  assert "model.layers.2.self_attn.q_proj.weight" in load_file(os.path.join(out, "model.safetensors"))
  tok = tokens(70)
  np.testing.assert_allclose(hf_logits(out, tok), np.asarray(model(jnp.asarray(tok))[0]), atol=1e-4)
  back = hf.load_policy(out, scan_layers=True)
  assert back.cfg == cfg
  want = params_of(model)
  for path, value in params_of(back).items():
    np.testing.assert_array_equal(value, want[path])
  unrolled = hf.load_policy(out)
  for i in range(3):
    np.testing.assert_array_equal(np.asarray(unrolled.layers[i].attn.wq[...]),
                                  np.asarray(model.layers.attn.wq[...][i]))


def test_scanned_load_inside_a_mesh_shards_the_weights(tmp_path):
  hf_dir = make_hf(tmp_path, "llama", tie_word_embeddings=False)
  plain = hf.load_policy(hf_dir, scan_layers=True)
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rules = (("batch", "data"), ("embed", "fsdp"), ("vocab", None), ("mlp", None), ("heads", None),
           ("kv_heads", None), ("head_dim", None), ("length", None), ("layers", None))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    sharded = hf.load_policy(hf_dir, scan_layers=True)
  assert sharded.layers.mlp.w_down[...].sharding.spec == jax.sharding.PartitionSpec(None, None, "fsdp")
  want = params_of(plain)
  for path, value in params_of(sharded).items():
    np.testing.assert_array_equal(value, want[path])


@pytest.mark.slow
def test_cli_scan_layers(tmp_path):
  hf_dir = make_hf(tmp_path, "qwen2", num_hidden_layers=3)
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-m", "mtrl_jax.models.hf", "check", "--hf_dir", hf_dir,
                         "--scan_layers"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  report = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
  assert report["scan_layers"] is True and report["n_layers"] == 3
  assert report["max_abs_logit_diff"] <= 1e-4 and report["greedy_match"] is True
