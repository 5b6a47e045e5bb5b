"""LoRA adapters: low-rank updates of the decoder's projection weights.

An adapted weight W (any of q/k/v/o and the SwiGLU gate/up/down) computes

    y = x W + (alpha / rank) * (x A) B

with A and B held as flax's `nnx.LoRAParam`, a subclass of `nnx.Param`: the
adapters are their own collection (`nnx.state(model, nnx.LoRAParam)`) and
everything else is the base. B starts at zero, so a freshly adapted model
computes exactly what its base computes (bit for bit: the added term is 0).

The shapes follow the base weight's einsum, as qwix's LoRA does: A takes the
weight's input (contracted) axes plus the rank, B the rank plus its output
axes, and each keeps the base weight's logical axis names there, so adapters
shard like their weights (the rank axis is replicated):

    wq [d, h, hd] -> wq_lora_a [d, r],     wq_lora_b [r, h, hd]
    wo [h, hd, d] -> wo_lora_a [h, hd, r], wo_lora_b [r, d]
    w_up [d, f]   -> w_up_lora_a [d, r],   w_up_lora_b [r, f]

Why not qwix or `nnx.LoRA` as they are (tried 2026-11-28, qwix 0.1.8): qwix
adds adapters by intercepting the einsums of the methods it wraps; it adapted
the unrolled model's `__call__`, but not `Transformer.hidden` (the path the
learner differentiates) and it failed on the scanned layout (IndexError while
tracing the layer scan). `nnx.LoRA` is a 2-D `x @ A @ B`; the attention
weights here are 3-D einsum tensors whose head axes shard on their own.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

# The weights an adapter may target, named as in the issue / PEFT's target_modules.
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
GROUPS = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down"), "all": TARGETS}
# target -> (sub-module of a Block, weight attribute)
WEIGHTS = {"q": ("attn", "wq"), "k": ("attn", "wk"), "v": ("attn", "wv"), "o": ("attn", "wo"),
           "gate": ("mlp", "w_gate"), "up": ("mlp", "w_up"), "down": ("mlp", "w_down")}
# How the sampler gets the adapters: "merge" folds them into the weights once
# per published version (decoding then costs what the base costs); "apply"
# decodes with the low-rank terms (no merged copy of the weights).
SAMPLER_MODES = ("merge", "apply")
ADAPTER = nnx.LoRAParam
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank 0 = no adapters (full fine-tuning); scale = alpha / rank."""

  rank: int = 0
  alpha: float = 16.0
  targets: tuple = TARGETS  # names of TARGETS, or the groups "attn", "mlp", "all"
  sampler: str = "merge"  # one of SAMPLER_MODES

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
      raise ValueError(f"lora.rank must be an integer >= 0 (0 = off), got {self.rank!r}")
    if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not self.alpha > 0:
      raise ValueError(f"lora.alpha must be a positive number, got {self.alpha!r}")
    object.__setattr__(self, "alpha", float(self.alpha))
    targets = self.targets
    if isinstance(targets, str):
      targets = tuple(t.strip() for t in targets.split(",") if t.strip())
    names = set()
    for t in tuple(targets):
      if t in GROUPS:
        names.update(GROUPS[t])
      elif t in TARGETS:
        names.add(t)
      else:
        raise ValueError(f"lora.targets: unknown target {t!r}; choose from {list(TARGETS)} "
                         f"or the groups {sorted(GROUPS)}")
    if not names:
      raise ValueError("lora.targets must name at least one weight")
    object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in names))
    if self.sampler not in SAMPLER_MODES:
      raise ValueError(f"lora.sampler={self.sampler!r}; choose one of {list(SAMPLER_MODES)}")

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def adapts(self, weight: str) -> bool:
    """Whether the weight attribute `weight` (e.g. "wq", "w_up") carries an adapter."""
    return self.enabled and any(WEIGHTS[t][1] == weight for t in self.targets)

  @classmethod
  def from_any(cls, x: Any) -> "LoraConfig":
    """From None (off), a LoraConfig, or a dict / ConfigDict, naming any unknown field."""
    if x is None:
      return cls()
    if isinstance(x, cls):
      return x
    d = dict(x.to_dict() if hasattr(x, "to_dict") else x)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown lora field(s) {unknown}; known: {sorted(known)}")
    if "targets" in d and not isinstance(d["targets"], str):
      d["targets"] = tuple(d["targets"])
    return cls(**d)


OFF = LoraConfig()


def adapter_pair(in_shape: tuple, in_names: tuple, out_shape: tuple, out_names: tuple, rank: int, dtype,
                 *, mesh_eager: bool) -> tuple[nnx.LoRAParam, nnx.LoRAParam]:
  """(A, B) of one weight, both zero here: `fresh_adapters` draws A once the whole model exists.

  Drawing A later (from one key taken after every base weight) keeps the
  base weights of a seed identical with and without adapters.
  """
  a = nnx.LoRAParam(jnp.zeros((*in_shape, rank), dtype), out_sharding=(*in_names, None),
                    eager_sharding=mesh_eager)
  b = nnx.LoRAParam(jnp.zeros((rank, *out_shape), dtype), out_sharding=(None, *out_names),
                    eager_sharding=mesh_eager)
  return a, b


def delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float, dtype) -> jax.Array:
  """scale * (x A) B: x [..., *in], A [*in, r], B [r, *out] -> [..., *out], in `dtype`."""
  xa = jnp.tensordot(x.astype(dtype), a.astype(dtype), axes=a.ndim - 1)
  return jnp.tensordot(xa * jnp.asarray(scale, dtype), b.astype(dtype), axes=1)


def apply(module: nnx.Module, weight: str, x: jax.Array, y: jax.Array, scale: float, dtype) -> jax.Array:
  """y plus the adapter term of `module.<weight>` when it has one (else y itself)."""
  a = getattr(module, weight + A_SUFFIX, None)
  if a is None:
    return y
  return y + delta(x, a[...], getattr(module, weight + B_SUFFIX)[...], scale, dtype).astype(y.dtype)


# ---------------------------------------------------------------- initialisation
def _layer_key(path: tuple):
  """(position of the blocks' 'layers' key, stacked?) or (None, False) outside the blocks."""
  for j, k in enumerate(path):
    if k == "layers" and j + 1 < len(path):
      return j, not isinstance(path[j + 1], int)
  return None, False


def _he_uniform(key, shape, fan_in: int, dtype):
  lim = jnp.sqrt(6.0 / max(fan_in, 1))
  return jax.random.uniform(key, shape, jnp.float32, -lim, lim).astype(dtype)


def fresh_adapters(state: nnx.State, key: jax.Array) -> nnx.State:
  """The adapters of `state` (LoRAParam leaves) drawn afresh: A he-uniform, B zero.

  A of layer i, weight w is drawn from a key of (i, w) only, so the scanned
  and the unrolled layouts of one seed hold the same adapters.
  """
  flat = []
  for path, var in nnx.to_flat_state(state):
    path = tuple(path)
    if not isinstance(var, nnx.LoRAParam):
      flat.append((path, var))
      continue
    value = var.get_value()
    if str(path[-1]).endswith(B_SUFFIX):
      flat.append((path, var.replace(jnp.zeros(value.shape, value.dtype))))
      continue
    j, stacked = _layer_key(path)
    tail = "/".join(map(str, path[j + (1 if stacked else 2):] if j is not None else path))
    wkey = jax.random.fold_in(key, zlib.crc32(tail.encode()))
    if stacked:
      layers = value.shape[0]
      rows = [_he_uniform(jax.random.fold_in(wkey, i), value.shape[1:], _fan_in(value.shape[1:]), value.dtype)
              for i in range(layers)]
      new = jnp.stack(rows)
    else:
      layer = int(path[j + 1]) if j is not None else 0
      new = _he_uniform(jax.random.fold_in(wkey, layer), value.shape, _fan_in(value.shape), value.dtype)
    flat.append((path, var.replace(new)))
  return nnx.from_flat_state(flat)


def _fan_in(a_shape: tuple) -> int:
  n = 1
  for s in a_shape[:-1]:
    n *= int(s)
  return n


# ---------------------------------------------------------------- state views
def split(state: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(adapters, base) of a model's state."""
  return nnx.split_state(state, ADAPTER, ...)


def adapters(state: nnx.State) -> nnx.State:
  return split(state)[0]


def base(state: nnx.State) -> nnx.State:
  return split(state)[1]


def has_adapters(state: nnx.State) -> bool:
  return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(state))


def trainable_filter(lora: LoraConfig, *, extra: tuple = ()):
  """What an optimiser updates: None (= everything) without adapters, else the
  adapters plus any path containing one of `extra` (e.g. a value head)."""
  if not lora.enabled:
    return None
  if not extra:
    return ADAPTER
  return nnx.Any(ADAPTER, *(nnx.PathContains(e) for e in extra))


def merge_into_weights(state: nnx.State, scale: float) -> nnx.State:
  """The base state with every adapter folded in: W + scale * A B (computed in fp32, cast
  to W's dtype). Returns the state of the same model without adapters (a state without
  adapters passes unchanged)."""
  flat = [(tuple(p), v) for p, v in nnx.to_flat_state(state)]
  by_path = dict(flat)
  out = []
  for path, var in flat:
    if isinstance(var, nnx.LoRAParam):
      continue
    a = by_path.get(path[:-1] + (str(path[-1]) + A_SUFFIX,))
    if a is None:
      out.append((path, var))
      continue
    b = by_path[path[:-1] + (str(path[-1]) + B_SUFFIX,)]
    w = var.get_value()
    _, stacked = _layer_key(path)
    out.append((path, var.replace(merged_weight(w, a.get_value(), b.get_value(), scale, stacked))))
  return nnx.from_flat_state(out)


def merged(state: nnx.State, cfg: LoraConfig) -> nnx.State:
  """`merge_into_weights` at cfg's scale: the state a model without adapters would hold."""
  return merge_into_weights(state, cfg.scale) if cfg.enabled else base(state)


def merged_weight(w, a, b, scale: float, stacked: bool):
  """W + scale * A B for one weight (A [*in, r], B [r, *out]; a leading layer axis when stacked)."""
  def one(w, a, b):
    d = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
    return (w.astype(jnp.float32) + scale * d).astype(w.dtype)
  return jax.vmap(one)(w, a, b) if stacked else one(w, a, b)


def adapter_bytes(state: nnx.State) -> int:
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(adapters(state)))


def describe(lora: LoraConfig) -> Mapping[str, Any]:
  return {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets), "sampler": lora.sampler}
