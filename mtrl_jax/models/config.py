"""Shape and numerics of a Llama/Qwen2-family decoder."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from mtrl_jax.models.attention import ATTENTION_IMPLS
from mtrl_jax.models.lora import OFF, LoraConfig

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# The precision switch: `dtype="auto"` computes in bfloat16 where the backend
# has fast bf16 matmuls (GPU, TPU) and in float32 on CPU (where bf16 is
# emulated, slower than fp32); `param_dtype="auto"` is float32 everywhere:
# master weights, and with them the optimiser state (optax keeps Adam's
# moments in the parameters' dtype), stay fp32, so small updates are not
# rounded away. An explicit "float32" / "bfloat16" / "float16" overrides.
AUTO = "auto"
ACCELERATORS = ("gpu", "tpu")


def resolve_precision(dtype: str, param_dtype: str, platform: str) -> tuple[str, str]:
  """(compute dtype, weight dtype) names for `platform`; "auto" as above, anything else kept."""
  if dtype == AUTO:
    dtype = "bfloat16" if platform in ACCELERATORS else "float32"
  if param_dtype == AUTO:
    param_dtype = "float32"
  return dtype, param_dtype


def _platform() -> str:
  import jax  # only a config that says "auto" asks the backend
  return jax.default_backend()
# What a rematerialised block keeps from its forward for the backward (the
# jax.checkpoint_policies behind each name are in transformer.py):
#   none           no remat: every intermediate is kept (fastest, most memory)
#   full           only the block's inputs; the whole block is recomputed
#   dots           every matmul output; the elementwise work is recomputed
#   dots_no_batch  matmul outputs with no batch dimension (weights-only
#                  products), i.e. not the attention score/value products
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")


# Fields that a Hugging Face checkpoint does not fix: how the model runs
# (kernel, layout, remat, chunking) and whether it carries LoRA adapters; a
# checkpoint fixes every other field, these stay the user's choice.
# param_dtype too: a checkpoint's storage dtype is not how we keep master weights.
RUNTIME_FIELDS = ("param_dtype", "attention", "attention_block", "scan_layers", "remat", "logits_chunk", "lora")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that fixes a decoder's parameter shapes and arithmetic.

  Llama and Qwen2 differ only in `qkv_bias` (Qwen2 has biases on q/k/v) and in
  their usual `rope_theta`; both are plain fields here.
  """

  vocab_size: int = 264
  dim: int = 256
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 64
  mlp_dim: int = 704
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = True
  # "auto" is resolved at construction (resolve_precision): the record then
  # holds the dtype that runs.
  dtype: str = "float32"  # activations / matmul inputs; or "auto": bf16 on GPU/TPU, fp32 on CPU
  param_dtype: str = "float32"  # stored weights (and optimiser state); "auto" = float32
  # Training-path (no KV cache) attention kernel; see mtrl_jax/models/attention.py.
  attention: str = "auto"
  attention_block: int = 512  # q and kv block size of the blockwise / splash kernels
  # Blocks' weights stacked on a leading "layers" axis and run by one scan, so
  # compile time does not grow with depth. Changes the parameter tree (not
  # the numbers): see mtrl_jax/models/layout.py to convert.
  scan_layers: bool = False
  remat: str = "none"  # one of REMAT_POLICIES; only the cache-free (training) forward
  # Sequence positions per chunk when the learner turns hidden states into
  # log-probs: [B, chunk, V] logits exist at a time instead of [B, T, V]
  # (forward and backward). 0 = all T at once. Memory only; numbers are equal.
  logits_chunk: int = 0
  # LoRA adapters on the projection weights (models/lora.py); rank 0 = none.
  # A dict or ConfigDict is accepted and turned into a LoraConfig.
  lora: LoraConfig = OFF

  def __post_init__(self):
    object.__setattr__(self, "lora", LoraConfig.from_any(self.lora))
    if AUTO in (self.dtype, self.param_dtype):
      dtype, param_dtype = resolve_precision(self.dtype, self.param_dtype, _platform())
      object.__setattr__(self, "dtype", dtype)
      object.__setattr__(self, "param_dtype", param_dtype)
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                 "attention_block"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.logits_chunk < 0:
      raise ValueError(f"ModelConfig.logits_chunk must be >= 0 (0 = unchunked), got {self.logits_chunk}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of "
          f"ModelConfig.n_kv_heads ({self.n_kv_heads}) for grouped-query attention")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    if self.attention not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention={self.attention!r}; choose one of {ATTENTION_IMPLS}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; choose one of "
                         f"{sorted(_DTYPES) + [AUTO]}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"ModelConfig.remat={self.remat!r}; choose one of {list(REMAT_POLICIES)}")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def weight_dtype(self):
    return _DTYPES[self.param_dtype]

  def num_params(self) -> int:
    """Parameter count of the base (adapters not counted: `num_adapter_params`), without building the model."""
    d, h, kv, hd, f, v = self.dim, self.n_heads, self.n_kv_heads, self.head_dim, self.mlp_dim, self.vocab_size
    attn = d * h * hd * 2 + d * kv * hd * 2 + (h * hd + 2 * kv * hd if self.qkv_bias else 0)
    layer = attn + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_embeddings else 2) + self.n_layers * layer + d

  def num_adapter_params(self) -> int:
    """Parameters of the LoRA adapters (0 without): rank x (inputs + outputs) per adapted weight."""
    d, h, kv, hd, f = self.dim, self.n_heads, self.n_kv_heads, self.head_dim, self.mlp_dim
    io = {"q": (d, h * hd), "k": (d, kv * hd), "v": (d, kv * hd), "o": (h * hd, d),
          "gate": (d, f), "up": (d, f), "down": (f, d)}
    if not self.lora.enabled:
      return 0
    return self.n_layers * self.lora.rank * sum(sum(io[t]) for t in self.lora.targets)

  @classmethod
  def from_dict(cls, d) -> "ModelConfig":
    """Builds from a dict/ConfigDict, naming any unknown field."""
    d = dict(d)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown model config field(s) {unknown}; known: {sorted(known)}")
    return cls(**d)
