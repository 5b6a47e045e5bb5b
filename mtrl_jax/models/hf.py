"""Import of local Hugging Face Llama / Qwen2 checkpoints (safetensors).

Reads `config.json` plus `model.safetensors` (or shards listed in
`model.safetensors.index.json`) with the numpy reader of `safetensors`, so no
torch is needed at load time. bf16 checkpoints arrive as ml_dtypes bfloat16
arrays and are cast to the requested parameter dtype.

    python -m mtrl_jax.models.hf check --hf_dir DIR
    python -m mtrl_jax.models.hf convert --gguf smollm2 --out DIR

compares a folder against transformers (see hf_check.py; torch is imported
only there), or writes such a folder from a GGUF file (gguf_convert.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core import spmd as core_spmd

from mtrl_jax.models import layout, lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"
# Old Llama checkpoints store RoPE tables; they are recomputed here, so ignore them.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_hf_config(hf_dir: str) -> dict:
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no config.json in hf_dir={hf_dir!r}")
  with open(path) as f:
    return json.load(f)


def architecture(hf_config: Mapping) -> str:
  """The single supported `architectures` entry of a config (or its model_type's)."""
  archs = list(hf_config.get("architectures") or [])
  if not archs and hf_config.get("model_type") in _MODEL_TYPES:
    archs = [_MODEL_TYPES[hf_config["model_type"]]]
  found = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
  if not found:
    name = archs or hf_config.get("model_type")
    raise ValueError(f"unsupported architecture {name!r} (config.json `architectures`); "
                     f"supported: {list(SUPPORTED_ARCHITECTURES)}")
  return found[0]


def _rope_theta(hf_config: Mapping) -> float:
  """RoPE base from either the transformers-5 `rope_parameters` or the older
  top-level `rope_theta` + `rope_scaling`; only unscaled RoPE is implemented."""
  for field in ("rope_parameters", "rope_scaling"):
    params = hf_config.get(field) or {}
    if not isinstance(params, Mapping):
      raise ValueError(f"config.json `{field}` must be a mapping, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in (None, "default"):
      raise ValueError(f"unsupported RoPE scaling {field}.rope_type={kind!r}; "
                       "only the default (unscaled) RoPE is implemented")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
      raise ValueError(f"unsupported {field}.partial_rotary_factor="
                       f"{params['partial_rotary_factor']}; only full rotary is implemented")
  params = hf_config.get("rope_parameters") or {}
  return float(params.get("rope_theta", hf_config.get("rope_theta", 10_000.0)))


def config_from_hf(hf_config: Mapping, dtype: str = "float32",
                   param_dtype: str | None = None, logits_chunk: int = 0) -> ModelConfig:
  """Maps a Llama/Qwen2 `config.json` (a dict, or a transformers config) to ModelConfig.

  `dtype` is the compute dtype; the weights are stored in `param_dtype`
  (default: the same). Features this decoder lacks (sliding windows, scaled
  RoPE, MLP or output-projection biases, other activations) are errors that
  name the config field, never silently dropped.
  """
  if hasattr(hf_config, "to_dict"):
    hf_config = hf_config.to_dict()
  arch = architecture(hf_config)
  if hf_config.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act={hf_config['hidden_act']!r}; only 'silu' (SwiGLU)")
  if hf_config.get("mlp_bias", False):
    raise ValueError("unsupported mlp_bias=True: the MLP here has no biases")
  if arch == "LlamaForCausalLM":
    # Llama's attention_bias also puts a bias on o_proj, which Attention lacks.
    if hf_config.get("attention_bias", False):
      raise ValueError("unsupported attention_bias=True for LlamaForCausalLM "
                       "(it adds an o_proj bias; only q/k/v biases are implemented)")
    qkv_bias = False
  else:
    qkv_bias = True
    # Older configs have no layer_types; Qwen2 then slides from layer max_window_layers on.
    n_layers = int(hf_config["num_hidden_layers"])
    slides = bool(hf_config.get("use_sliding_window") and hf_config.get("sliding_window"))
    first_sliding = int(hf_config.get("max_window_layers") or 0)
    layer_types = hf_config.get("layer_types") or [
        "sliding_attention" if slides and i >= first_sliding else "full_attention" for i in range(n_layers)]
    if any(t != "full_attention" for t in layer_types):
      raise ValueError("unsupported use_sliding_window / layer_types with sliding attention; "
                       "only full attention is implemented")
  dim, n_heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
  return ModelConfig(
      vocab_size=int(hf_config["vocab_size"]),
      dim=dim,
      n_layers=int(hf_config["num_hidden_layers"]),
      n_heads=n_heads,
      n_kv_heads=int(hf_config.get("num_key_value_heads") or n_heads),
      head_dim=int(hf_config.get("head_dim") or dim // n_heads),
      mlp_dim=int(hf_config["intermediate_size"]),
      rope_theta=_rope_theta(hf_config),
      norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
      qkv_bias=qkv_bias,
      tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
      dtype=dtype,
      param_dtype=param_dtype or dtype,
      logits_chunk=logits_chunk,
  )


class TensorMap(NamedTuple):
  """How one of our parameters is stored in a HF checkpoint."""
  hf_name: str
  hf_shape: tuple
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def tensor_map(path: tuple, cfg: ModelConfig) -> TensorMap:
  """The HF tensor behind our parameter at `path` (as in `nnx.to_flat_state`).

  HF linear weights are [out, in]; ours are [in, ...] with heads split out.
  """
  d, h, kv, hd, f, v = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
  same = lambda x: x  # noqa: E731
  tr = lambda x: x.T  # noqa: E731
  if path == ("embed",):
    return TensorMap("model.embed_tokens.weight", (v, d), same, same)
  if path == ("final_norm", "scale"):
    return TensorMap("model.norm.weight", (d,), same, same)
  if path == ("lm_head",):
    return TensorMap("lm_head.weight", (v, d), tr, tr)
  if len(path) < 3 or path[0] != "layers":
    raise KeyError(f"no HF tensor for parameter {'/'.join(map(str, path))}")
  pre, sub = f"model.layers.{int(path[1])}.", tuple(path[2:])

  def proj(n_out_heads):
    return (lambda w: w.T.reshape(d, n_out_heads, hd),
            lambda w: w.reshape(d, n_out_heads * hd).T)

  def bias(n):
    return (lambda b: b.reshape(n, hd), lambda b: b.reshape(n * hd))

  table = {
      ("attn_norm", "scale"): ("input_layernorm.weight", (d,), same, same),
      ("mlp_norm", "scale"): ("post_attention_layernorm.weight", (d,), same, same),
      ("attn", "wq"): ("self_attn.q_proj.weight", (h * hd, d), *proj(h)),
      ("attn", "wk"): ("self_attn.k_proj.weight", (kv * hd, d), *proj(kv)),
      ("attn", "wv"): ("self_attn.v_proj.weight", (kv * hd, d), *proj(kv)),
      ("attn", "wo"): ("self_attn.o_proj.weight", (d, h * hd),
                       lambda w: w.T.reshape(h, hd, d), lambda w: w.reshape(h * hd, d).T),
      ("attn", "bq"): ("self_attn.q_proj.bias", (h * hd,), *bias(h)),
      ("attn", "bk"): ("self_attn.k_proj.bias", (kv * hd,), *bias(kv)),
      ("attn", "bv"): ("self_attn.v_proj.bias", (kv * hd,), *bias(kv)),
      ("mlp", "w_gate"): ("mlp.gate_proj.weight", (f, d), tr, tr),
      ("mlp", "w_up"): ("mlp.up_proj.weight", (f, d), tr, tr),
      ("mlp", "w_down"): ("mlp.down_proj.weight", (d, f), tr, tr),
  }
  if sub not in table:
    raise KeyError(f"no HF tensor for parameter {'/'.join(map(str, path))}")
  name, shape, to_ours, to_hf = table[sub]
  return TensorMap(pre + name, shape, to_ours, to_hf)


def _is_stacked(path: tuple) -> bool:
  """A scanned model's block parameter: ('layers', 'attn', 'wq') holds all layers."""
  return len(path) >= 2 and path[0] == "layers" and not isinstance(path[1], int)


def tensor_maps(path: tuple, cfg: ModelConfig) -> list[TensorMap]:
  """The HF tensors behind our parameter at `path`, in the order they stack.

  One for an unrolled parameter; one per layer (layer 0 first) for a block
  parameter of a scanned model, whose rows are the layers.
  """
  path = tuple(path)
  if _is_stacked(path):
    return [tensor_map(("layers", i, *path[1:]), cfg) for i in range(cfg.n_layers)]
  return [tensor_map(path, cfg)]


class Checkpoint:
  """Lazy reader of the safetensors files of one folder, tensor by tensor."""

  def __init__(self, hf_dir: str):
    from safetensors import safe_open  # a light dependency, but not a core one
    self._safe_open = safe_open
    self.hf_dir = hf_dir
    index, single = os.path.join(hf_dir, _INDEX_FILE), os.path.join(hf_dir, _SINGLE_FILE)
    if os.path.exists(index):
      with open(index) as f:
        self.weight_map = dict(json.load(f)["weight_map"])
    elif os.path.exists(single):
      with safe_open(single, framework="numpy") as f:
        self.weight_map = {k: _SINGLE_FILE for k in f.keys()}
    else:
      raise FileNotFoundError(f"hf_dir={hf_dir!r} has neither {_SINGLE_FILE} nor {_INDEX_FILE}")
    self._handles = {}

  def names(self) -> list[str]:
    return sorted(self.weight_map)

  def read(self, name: str, shape: tuple) -> np.ndarray:
    if name not in self.weight_map:
      raise KeyError(f"checkpoint {self.hf_dir!r} lacks tensor {name!r}")
    file = self.weight_map[name]
    if file not in self._handles:
      path = os.path.join(self.hf_dir, file)
      if not os.path.exists(path):
        raise FileNotFoundError(f"tensor {name!r} is mapped to missing shard {path!r}")
      self._handles[file] = self._safe_open(path, framework="numpy")
    arr = self._handles[file].get_tensor(name)
    if tuple(arr.shape) != tuple(shape):
      raise ValueError(f"tensor {name!r} has shape {tuple(arr.shape)}, config implies {tuple(shape)}")
    return arr


def _place(arr: np.ndarray, var: nnx.Variable, dtype) -> jax.Array:
  """Device array for a parameter, sharded by its logical names inside a mesh context."""
  names = var.get_metadata().get("out_sharding")
  rules = core_spmd.get_logical_axis_rules()
  mesh = jax.sharding.get_abstract_mesh()
  arr = np.asarray(arr).astype(dtype)
  if names is None or not rules or mesh is None or mesh.empty:
    return jnp.asarray(arr)
  spec = jax.sharding.PartitionSpec(*core_spmd.from_sharding_rules(names, rules))
  return jax.device_put(arr, spec)


def _fill(cfg: ModelConfig, ckpt: Checkpoint, params) -> list[str]:
  """Writes checkpoint tensors into `params` (a model's Param state); returns the HF names read."""
  used = []
  for path, var in nnx.to_flat_state(params):
    tms = tensor_maps(tuple(path), cfg)
    arrs = [tm.to_ours(ckpt.read(tm.hf_name, tm.hf_shape)) for tm in tms]
    arr = np.stack(arrs) if _is_stacked(tuple(path)) else arrs[0]
    var.set_value(_place(arr, var, var.get_value().dtype))
    used.extend(tm.hf_name for tm in tms)
  return used


def _check_unused(ckpt: Checkpoint, used: list[str], allowed_extra=()) -> None:
  """An unknown tensor means the config missed a feature: refuse rather than ignore it."""
  extra = [n for n in ckpt.names() if n not in set(used) and n not in allowed_extra
           and not n.endswith(_IGNORED_SUFFIXES)]
  if extra:
    raise ValueError(f"checkpoint {ckpt.hf_dir!r} has tensors this model does not use: {extra[:8]}"
                     f"{' ...' if len(extra) > 8 else ''}")


def _is_embedding_copy(ckpt: Checkpoint, cfg: ModelConfig) -> bool:
  """Whether the checkpoint's lm_head.weight (if any) equals its embedding, bit for bit."""
  if "lm_head.weight" not in ckpt.names():
    return False
  shape = (cfg.vocab_size, cfg.dim)
  return bool(np.array_equal(ckpt.read("lm_head.weight", shape), ckpt.read("model.embed_tokens.weight", shape)))


def load_policy(hf_dir: str, *, dtype: str = "float32", lora_seed: int = 0, **switches) -> Transformer:
  """A policy Transformer with the weights of a local Llama/Qwen2 folder.

  The module is built abstractly (no random init) and filled tensor by tensor;
  inside `jax.set_mesh` + `nnx.logical_axis_rules` each weight lands sharded.
  `scan_layers`/`remat`/`lora` are ours, not the checkpoint's (see
  ModelConfig); with scan_layers the per-layer HF tensors are stacked into the
  layer axis. With `lora` the checkpoint is the frozen base and fresh
  adapters (A drawn from `lora_seed`, B zero) are added.
  """
  cfg = dataclasses.replace(config_from_hf(read_hf_config(hf_dir), dtype=dtype), **switches)
  ckpt = Checkpoint(hf_dir)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, adapters, params, rest = nnx.split(abstract, lora.ADAPTER, nnx.Param, ...)
  used = _fill(cfg, ckpt, params)
  # Tied checkpoints sometimes also store lm_head.weight (= the embedding): accepted
  # only when it is that copy. A different one means the config's tie is wrong and
  # the logits would silently use the embedding instead (issue 34: a GGUF import
  # that declared every model tied).
  tied_copy = cfg.tie_embeddings and _is_embedding_copy(ckpt, cfg)
  _check_unused(ckpt, used, allowed_extra=("lm_head.weight",) if tied_copy else ())
  fresh = dict(nnx.to_flat_state(lora.fresh_adapters(adapters, jax.random.key(lora_seed))))
  for path, var in nnx.to_flat_state(adapters):
    var.set_value(_place(np.asarray(fresh[path].get_value()), var, var.get_value().dtype))
  return nnx.merge(graphdef, adapters, params, rest)


def load_critic_trunk(hf_dir: str, critic) -> None:
  """Overwrites `critic.trunk` (embedding, blocks, final norm) from a HF folder.

  The value head is left alone; the LM head of the checkpoint is ignored.
  """
  cfg = config_from_hf(read_hf_config(hf_dir), dtype=critic.trunk.cfg.dtype,
                       param_dtype=critic.trunk.cfg.param_dtype)
  for field in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                "qkv_bias", "rope_theta", "norm_eps"):
    ours, theirs = getattr(critic.trunk.cfg, field), getattr(cfg, field)
    if ours != theirs:
      raise ValueError(f"critic trunk {field}={ours} but {hf_dir!r} has {field}={theirs}")
  ckpt = Checkpoint(hf_dir)
  state = nnx.state(critic.trunk, nnx.All(nnx.Param, nnx.Not(lora.ADAPTER)))  # adapters stay as they are
  used = _fill(critic.trunk.cfg, ckpt, state)
  _check_unused(ckpt, used, allowed_extra=("lm_head.weight",))
  nnx.update(critic.trunk, state)


def hf_config_from(cfg: ModelConfig, architecture_name: str | None = None) -> dict:
  """A `config.json` dict that transformers reads back as the same decoder."""
  arch = architecture_name or ("Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"unsupported architecture {arch!r}; supported: {list(SUPPORTED_ARCHITECTURES)}")
  if (arch == "Qwen2ForCausalLM") != cfg.qkv_bias:
    raise ValueError(f"ModelConfig.qkv_bias={cfg.qkv_bias} does not fit {arch} "
                     "(Qwen2 has q/k/v biases, Llama none)")
  out = {
      "architectures": [arch],
      "model_type": "qwen2" if arch == "Qwen2ForCausalLM" else "llama",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.dim,
      "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.n_kv_heads,
      "head_dim": cfg.head_dim,
      "intermediate_size": cfg.mlp_dim,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.norm_eps,
      # Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta.
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": cfg.tie_embeddings,
      "torch_dtype": cfg.param_dtype,
      "max_position_embeddings": 32768,
  }
  if arch == "LlamaForCausalLM":
    out.update(attention_bias=False, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out


def export_policy(model: Transformer, out_dir: str, *, architecture_name: str | None = None) -> None:
  """Writes `config.json` + `model.safetensors` that transformers loads as the same model.

  LoRA adapters are merged into the weights they adapt (W + alpha/rank A B);
  `export_peft_adapter` writes them on their own instead.
  """
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  tensors = {}
  for path, var in nnx.to_flat_state(lora.merged(nnx.state(model, nnx.Param), model.cfg.lora)):
    value = np.asarray(jax.device_get(var.get_value()))
    tms = tensor_maps(tuple(path), model.cfg)
    rows = list(value) if _is_stacked(tuple(path)) else [value]  # a scanned block: one row per layer
    for tm, row in zip(tms, rows, strict=True):
      tensors[tm.hf_name] = np.ascontiguousarray(tm.to_hf(row))
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config_from(model.cfg, architecture_name), f, indent=2)
  save_file(tensors, os.path.join(out_dir, _SINGLE_FILE), metadata={"format": "pt"})


# Our adapted weight -> the HF module PEFT names in target_modules.
_PEFT_MODULES = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                 "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                 "w_down": "mlp.down_proj"}
PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def export_peft_adapter(model: Transformer, out_dir: str, *, base_model_name_or_path: str = "") -> dict:
  """Writes the model's LoRA adapters as a PEFT adapter folder; returns the adapter config.

  `adapter_config.json` + `adapter_model.safetensors` (keys
  `base_model.model.model.layers.<i>.<module>.lora_A.weight` [r, in] and
  `lora_B.weight` [out, r]): `peft.PeftModel.from_pretrained(base, out_dir)`
  over the base checkpoint (e.g. `export_policy` of the model without its
  adapters, or the HF folder it was loaded from) computes what this model does.
  """
  from safetensors.numpy import save_file
  cfg = model.cfg.lora
  if not cfg.enabled:
    raise ValueError("export_peft_adapter: the model has no LoRA adapters (ModelConfig.lora.rank is 0)")
  adapters = layout.unstack_flat(nnx.to_flat_state(nnx.state(model, lora.ADAPTER)))
  tensors = {}
  for path, var in adapters:
    path = tuple(path)
    if len(path) != 4 or path[0] != "layers":
      raise KeyError(f"no PEFT tensor for adapter {'/'.join(map(str, path))}")
    name = str(path[3])
    weight, side = (name[:-len(lora.A_SUFFIX)], "A") if name.endswith(lora.A_SUFFIX) else (
        name[:-len(lora.B_SUFFIX)], "B")
    value = np.asarray(jax.device_get(var.get_value())).astype(np.float32)
    r = cfg.rank
    # Ours: A [*in, r], B [r, *out]; PEFT: lora_A [r, in], lora_B [out, r] (torch Linear layout).
    value = value.reshape(-1, r).T if side == "A" else value.reshape(r, -1).T
    key = f"base_model.model.model.layers.{int(path[1])}.{_PEFT_MODULES[weight]}.lora_{side}.weight"
    tensors[key] = np.ascontiguousarray(value)
  config = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.rank, "lora_alpha": cfg.alpha,
      "target_modules": sorted({_PEFT_MODULES[lora.WEIGHTS[t][1]].split(".")[1] for t in cfg.targets}),
      "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
      "base_model_name_or_path": base_model_name_or_path, "inference_mode": True,
      "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
      "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "revision": None,
  }
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, PEFT_CONFIG_FILE), "w") as f:
    json.dump(config, f, indent=2)
  save_file(tensors, os.path.join(out_dir, PEFT_WEIGHTS_FILE), metadata={"format": "pt"})
  return config


if __name__ == "__main__":
  # `python -m mtrl_jax.models.hf check|convert`: the command line is hf_check.py's (it imports this
  # module, so this module names it only here, at run time: no import cycle between the two).
  import runpy

  runpy.run_module("mtrl_jax.models.hf_check", run_name="__main__", alter_sys=True)
