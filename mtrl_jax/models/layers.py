"""Building blocks of the decoder: norm, rotary embedding, attention, MLP.

Parameters and activations carry *logical* axis names only (`embed`, `mlp`,
`heads`, `kv_heads`, `head_dim`, `vocab`, `batch`, `length`); the mapping to a
device mesh lives in the config (see mtrl_jax/parallel).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd as core_spmd

from mtrl_jax.models import lora
from mtrl_jax.models.attention import attention
from mtrl_jax.models.config import ModelConfig


def shard(x: jax.Array, names: tuple) -> jax.Array:
  """Constrains an activation to the mesh axes its logical `names` map to.

  A no-op outside a mesh + logical-rules context, so the same model code runs
  unsharded in tests and sharded under `jax.set_mesh` + `nnx.logical_axis_rules`.
  """
  rules = core_spmd.get_logical_axis_rules()
  mesh = jax.sharding.get_abstract_mesh()
  if not rules or mesh is None or mesh.empty:
    return x
  spec = jax.sharding.PartitionSpec(*core_spmd.from_sharding_rules(names, rules))
  return jax.lax.with_sharding_constraint(x, spec)


def _param(rngs, init, shape, names, dtype):
  """A parameter annotated with logical axis names.

  Inside a mesh context (jax.set_mesh + nnx.logical_axis_rules) it is created
  already sharded; outside one it is a plain array that keeps the annotation,
  so `nnx.get_partition_spec` still knows how to shard it later.
  """
  mesh = jax.sharding.get_abstract_mesh()
  eager = mesh is not None and not mesh.empty
  value = init(rngs.params(), shape, dtype)
  return nnx.Param(value, out_sharding=names, eager_sharding=eager)


def _add_adapters(module: nnx.Module, cfg: ModelConfig, specs: dict) -> None:
  """LoRA (A, B) of each weight of `specs` that cfg.lora targets, as `<weight>_lora_a/_b`.

  specs: weight -> (input shape, input names, output shape, output names),
  the split of the weight's axes into the contracted and the produced ones.
  """
  mesh = jax.sharding.get_abstract_mesh()
  eager = mesh is not None and not mesh.empty
  for weight, (in_shape, in_names, out_shape, out_names) in specs.items():
    if cfg.lora.adapts(weight):
      a, b = lora.adapter_pair(in_shape, in_names, out_shape, out_names, cfg.lora.rank, cfg.weight_dtype,
                               mesh_eager=eager)
      setattr(module, weight + lora.A_SUFFIX, a)
      setattr(module, weight + lora.B_SUFFIX, b)


def _project(module: nnx.Module, weight: str, spec: str, x: jax.Array) -> jax.Array:
  """x times one projection weight of `module` (an einsum `spec`), plus its LoRA term when it has one."""
  cfg = module.cfg
  dt = cfg.compute_dtype
  y = jnp.einsum(spec, x, getattr(module, weight)[...].astype(dt))
  return lora.apply(module, weight, x, y, cfg.lora.scale if cfg.lora.enabled else 0.0, dt)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs):
    self.eps = eps
    self.scale = _param(rngs, nnx.initializers.ones, (dim,), ("embed",), dtype)

  def __call__(self, x):
    # Normalise in fp32 whatever the compute dtype: bf16 variance is too coarse.
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope(x_bthd: jax.Array, pos_bt: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding in the "rotate half" layout used by HF Llama/Qwen2."""
  d = x_bthd.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  ang = pos_bt.astype(jnp.float32)[..., None] * inv_freq  # [B,T,d/2]
  cos = jnp.cos(jnp.concatenate([ang, ang], -1))[:, :, None, :]
  sin = jnp.sin(jnp.concatenate([ang, ang], -1))[:, :, None, :]
  x = x_bthd.astype(jnp.float32)
  x1, x2 = x[..., : d // 2], x[..., d // 2:]
  rot = jnp.concatenate([-x2, x1], -1)
  return (x * cos + rot * sin).astype(x_bthd.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with optional q/k/v bias (Qwen2)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, kv, hd, pdt = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.weight_dtype
    init = nnx.initializers.normal(0.02)
    self.wq = _param(rngs, init, (d, h, hd), ("embed", "heads", "head_dim"), pdt)
    self.wk = _param(rngs, init, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pdt)
    self.wv = _param(rngs, init, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pdt)
    self.wo = _param(rngs, init, (h, hd, d), ("heads", "head_dim", "embed"), pdt)
    if cfg.qkv_bias:
      zeros = nnx.initializers.zeros
      self.bq = _param(rngs, zeros, (h, hd), ("heads", "head_dim"), pdt)
      self.bk = _param(rngs, zeros, (kv, hd), ("kv_heads", "head_dim"), pdt)
      self.bv = _param(rngs, zeros, (kv, hd), ("kv_heads", "head_dim"), pdt)
    _add_adapters(self, cfg, {
        "wq": ((d,), ("embed",), (h, hd), ("heads", "head_dim")),
        "wk": ((d,), ("embed",), (kv, hd), ("kv_heads", "head_dim")),
        "wv": ((d,), ("embed",), (kv, hd), ("kv_heads", "head_dim")),
        "wo": ((h, hd), ("heads", "head_dim"), (d,), ("embed",))})

  def __call__(self, x_btd, pos_bt, k_cache, v_cache, write_pos_bt, kv_len_b, segment_ids_bt=None):
    """Attends the new tokens to the cache (or to themselves when no cache).

    k_cache/v_cache: [B,KV,S,hd] or None. write_pos_bt: the cache slot of each
    new token (= its RoPE position). kv_len_b: valid cache length per row after
    this call's writes; slots at or beyond it are never attended.

    Without a cache (training) the mask is causal by index within the row and,
    given `segment_ids_bt` [B,T], restricted to the token's own segment
    (packed rows); `cfg.attention` picks the kernel (models/attention.py) and
    pos_bt only rotates q/k, so it may restart in each segment.
    """
    cfg, dt = self.cfg, self.cfg.compute_dtype
    x = x_btd.astype(dt)
    q = _project(self, "wq", "btd,dhk->bthk", x)
    k = _project(self, "wk", "btd,dhk->bthk", x)
    v = _project(self, "wv", "btd,dhk->bthk", x)
    if cfg.qkv_bias:
      q, k, v = q + self.bq[...].astype(dt), k + self.bk[...].astype(dt), v + self.bv[...].astype(dt)
    q = shard(rope(q, pos_bt, cfg.rope_theta), ("batch", "length", "heads", "head_dim"))
    k = shard(rope(k, pos_bt, cfg.rope_theta), ("batch", "length", "kv_heads", "head_dim"))
    v = shard(v, ("batch", "length", "kv_heads", "head_dim"))

    if k_cache is None:
      out = attention(q, k, v, segment_ids_bt=segment_ids_bt, impl=cfg.attention,
                      block_q=cfg.attention_block, block_kv=cfg.attention_block)
      y = _project(self, "wo", "bthk,hkd->btd", out)
      return shard(y, ("batch", "length", "embed")), k_cache, v_cache
    else:
      if segment_ids_bt is not None:
        raise ValueError("segment_ids_bt is for the training path only (no KV cache)")
      # Scatter the new tokens into their slots; out-of-range slots are dropped
      # rather than clamped, so an over-full row never corrupts valid entries.
      b_idx = jnp.arange(x.shape[0])[:, None]
      write_pos, k_w, v_w = write_pos_bt, k, v
      if write_pos.size == 1:
        # A one-slot write (batch 1, one token) becomes a dynamic-update-slice
        # that XLA:CPU fuses into both users of the cache, copying every layer's
        # cache at each decode step; a second, out-of-range (dropped) slot
        # keeps it a scatter, which is updated in place.
        write_pos = jnp.concatenate([write_pos, jnp.full_like(write_pos, k_cache.shape[2])], axis=1)
        k_w, v_w = jnp.concatenate([k, k], axis=1), jnp.concatenate([v, v], axis=1)
      k_cache = k_cache.at[b_idx, :, write_pos].set(k_w.astype(k_cache.dtype), mode="drop")
      v_cache = v_cache.at[b_idx, :, write_pos].set(v_w.astype(v_cache.dtype), mode="drop")
      keys, vals = k_cache.astype(dt), v_cache.astype(dt)
      key_pos = jnp.broadcast_to(jnp.arange(keys.shape[2]), (keys.shape[0], keys.shape[2]))

    # Keys/values are [B,KV,S,hd]: with the kv head ahead of the slot axis both
    # products are plain batched matmuls, so decoding never transposes the whole
    # cache (with [B,S,KV,hd] XLA copied it at every step, 2x slower on CPU).
    b, t, h, hd = q.shape
    kvh = keys.shape[1]
    qg = q.reshape(b, t, kvh, h // kvh, hd)
    logits = jnp.einsum("btgrk,bgsk->bgrts", qg, keys).astype(jnp.float32) / jnp.sqrt(hd).astype(jnp.float32)
    mask = key_pos[:, None, :] <= pos_bt[:, :, None]  # causal, [B,T,S]
    mask &= key_pos[:, None, :] < kv_len_b[:, None, None]
    logits = jnp.where(mask[:, None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(dt)
    # Contract into [b,g,r,t,k] and transpose the (small) result: asking the
    # einsum for btgrk directly made XLA:CPU pick a slow dot that reads the
    # cache transposed (40x slower per decode step at 768 slots).
    out = jnp.einsum("bgrts,bgsk->bgrtk", probs, vals).transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)
    y = _project(self, "wo", "bthk,hkd->btd", out)
    return shard(y, ("batch", "length", "embed")), k_cache, v_cache


class MLP(nnx.Module):
  """SwiGLU feed-forward."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    init, pdt = nnx.initializers.normal(0.02), cfg.weight_dtype
    self.w_gate = _param(rngs, init, (cfg.dim, cfg.mlp_dim), ("embed", "mlp"), pdt)
    self.w_up = _param(rngs, init, (cfg.dim, cfg.mlp_dim), ("embed", "mlp"), pdt)
    self.w_down = _param(rngs, init, (cfg.mlp_dim, cfg.dim), ("mlp", "embed"), pdt)
    d, f = cfg.dim, cfg.mlp_dim
    _add_adapters(self, cfg, {"w_gate": ((d,), ("embed",), (f,), ("mlp",)),
                              "w_up": ((d,), ("embed",), (f,), ("mlp",)),
                              "w_down": ((f,), ("mlp",), (d,), ("embed",))})

  def __call__(self, x):
    dt = self.cfg.compute_dtype
    x = x.astype(dt)
    g = _project(self, "w_gate", "btd,df->btf", x)
    u = _project(self, "w_up", "btd,df->btf", x)
    hdn = shard(jax.nn.silu(g) * u, ("batch", "length", "mlp"))
    return _project(self, "w_down", "btf,fd->btd", hdn)
