"""Decoder-only transformer of the Llama / Qwen2 family, with a KV cache.

One forward serves training (no cache: the whole sequence at once) and
sampling (a cache that persists across the turns of a session: each call
appends only the new tokens, whatever the row's context length).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from mtrl_jax.models import layout, lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.layers import MLP, Attention, RMSNorm, _param, shard


class KVCache(NamedTuple):
  """Keys/values [B, KV, S, hd] per layer and the valid length of each row.

  Unrolled models hold a tuple of per-layer arrays; scanned models
  (`ModelConfig.scan_layers`) one array [L, B, KV, S, hd] that the layer scan
  reads and writes row by row. Rows fill from slot 0 with no left padding: a
  token's slot is its RoPE position, so rows of different lengths in one
  batch are exact.
  """
  k: tuple | jax.Array
  v: tuple | jax.Array
  length_b: jax.Array  # int32 [B]

  @property
  def capacity(self) -> int:
    return self.k[0].shape[-2]  # k[0] is layer 0's [B, KV, S, hd] in both layouts


# jax.checkpoint policy per ModelConfig.remat name ("none" = no checkpoint).
REMAT_POLICY = {
    "full": None,  # save nothing but the block's inputs
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, cfg.weight_dtype, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps, cfg.weight_dtype, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, pos_bt, k_cache, v_cache, write_pos_bt, kv_len_b, segment_ids_bt=None):
    a, k_cache, v_cache = self.attn(self.attn_norm(x), pos_bt, k_cache, v_cache, write_pos_bt, kv_len_b,
                                    segment_ids_bt)
    x = x + a.astype(x.dtype)
    x = x + self.mlp(self.mlp_norm(x)).astype(x.dtype)
    return shard(x, ("batch", "length", "embed")), k_cache, v_cache


class Transformer(nnx.Module):
  """The policy network. `lm_head=False` builds a bare trunk (for a critic).

  With `cfg.lora.rank > 0` the blocks' projection weights carry LoRA
  adapters (models/lora.py), which start as a no-op.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, lm_head: bool = True):
    self.cfg = cfg
    pdt = cfg.weight_dtype
    self.embed = _param(rngs, nnx.initializers.normal(0.02), (cfg.vocab_size, cfg.dim), ("vocab", "embed"), pdt)
    # Blocks are built one by one in both layouts, so a seed gives the same
    # weights whether or not they are then stacked for the scan.
    blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)]
    self.layers = layout.stack_modules(blocks) if cfg.scan_layers else nnx.List(blocks)
    self.final_norm = RMSNorm(cfg.dim, cfg.norm_eps, pdt, rngs=rngs)
    self.has_lm_head = lm_head
    if lm_head and not cfg.tie_embeddings:
      self.lm_head = _param(rngs, nnx.initializers.normal(0.02), (cfg.dim, cfg.vocab_size), ("embed", "vocab"), pdt)
    if cfg.lora.enabled:
      # The adapters' A from one key drawn after every base weight, so a seed
      # gives the same base with or without adapters (B is zero: same outputs too).
      nnx.update(self, lora.fresh_adapters(nnx.state(self, lora.ADAPTER), rngs.params()))

  def init_cache(self, batch: int, capacity: int, dtype=None) -> KVCache:
    cfg = self.cfg
    dtype = dtype or cfg.compute_dtype
    shape = (batch, cfg.n_kv_heads, capacity, cfg.head_dim)
    length_b = jnp.zeros((batch,), jnp.int32)
    if cfg.scan_layers:
      stacked = (cfg.n_layers, *shape)
      return KVCache(jnp.zeros(stacked, dtype), jnp.zeros(stacked, dtype), length_b)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers))
    return KVCache(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)), length_b=length_b)

  def hidden(self, tokens_bt: jax.Array, cache: KVCache | None = None,
             n_new_b: jax.Array | None = None, positions_bt: jax.Array | None = None,
             segment_ids_bt: jax.Array | None = None):
    """Final-normed hidden states [B,T,D] (compute dtype) and the updated cache.

    Without a cache the T tokens attend causally to each other (right padding
    is harmless: real tokens never look right). With a cache, row b appends its
    first n_new_b[b] tokens (default all T) after its current length; the rest
    of the row is padding whose outputs are meaningless and whose slots are
    reclaimed by the next call.

    `segment_ids_bt` (int32 [B,T], no cache only) packs several sequences in a
    row: a token attends only to earlier tokens with its own id; pass
    `positions_bt` restarting at 0 in each segment.

    The cache-free forward (the one that is differentiated) rematerialises
    each block as `cfg.remat` says; a cached forward never does.
    """
    b, t = tokens_bt.shape
    steps = jnp.arange(t, dtype=jnp.int32)[None, :]
    if cache is None:
      pos = jnp.broadcast_to(steps, (b, t)) if positions_bt is None else positions_bt
      kv_len = jnp.full((b,), jnp.iinfo(jnp.int32).max, jnp.int32)
    else:
      pos = cache.length_b[:, None] + steps
      n_new = jnp.full((b,), t, jnp.int32) if n_new_b is None else n_new_b.astype(jnp.int32)
      kv_len = cache.length_b + n_new
    x = self.embed[...].astype(self.cfg.compute_dtype)[tokens_bt]
    x = shard(x, ("batch", "length", "embed"))
    remat = self.cfg.remat if cache is None else "none"
    ks = vs = None
    if cache is not None:
      ks, vs = cache.k, cache.v
    if self.cfg.scan_layers:
      x, ks, vs = self._scan_blocks(x, pos, ks, vs, kv_len, segment_ids_bt, remat)
    else:
      x, ks, vs = self._unrolled_blocks(x, pos, ks, vs, kv_len, segment_ids_bt, remat)
    x = self.final_norm(x)
    new_cache = None if cache is None else KVCache(ks, vs, kv_len)
    return x, new_cache

  def _unrolled_blocks(self, x, pos, ks, vs, kv_len, segment_ids_bt, remat):
    """One traced copy of the block per layer; caches are tuples of layers."""
    new_ks, new_vs = [], []
    for i, layer in enumerate(self.layers):
      kc = None if ks is None else ks[i]
      vc = None if vs is None else vs[i]
      if remat == "none":
        x, kc, vc = layer(x, pos, kc, vc, pos, kv_len, segment_ids_bt)
      else:
        graphdef, params = nnx.split(layer)
        step = _block_step(graphdef, remat, prevent_cse=True)
        x, kc, vc = step(params, x, pos, kc, vc, kv_len, segment_ids_bt)
      new_ks.append(kc)
      new_vs.append(vc)
    if ks is None:
      return x, None, None
    return x, tuple(new_ks), tuple(new_vs)

  def _scan_blocks(self, x, pos, ks, vs, kv_len, segment_ids_bt, remat):
    """One traced block run by lax.scan over the stacked weights (and caches [L, ...])."""
    graphdef, params = nnx.split(self.layers)
    # lax.scan already keeps the recomputation from being merged with the
    # forward, so the CSE barrier of jax.checkpoint is not needed.
    step = _block_step(graphdef, remat, prevent_cse=False)

    def body(x, layer):
      params_l, kc, vc = layer
      x, kc, vc = step(params_l, x, pos, kc, vc, kv_len, segment_ids_bt)
      return x, (kc, vc)

    x, (ks, vs) = jax.lax.scan(body, x, (params, ks, vs))
    return x, ks, vs

  def unembedding(self) -> jax.Array:
    """The output projection [D, V] in the compute dtype (the tied embedding or lm_head)."""
    if not self.has_lm_head:
      raise ValueError("this Transformer was built with lm_head=False (a critic trunk)")
    w = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
    return w.astype(self.cfg.compute_dtype)

  def logits(self, h_btd: jax.Array) -> jax.Array:
    """Vocabulary logits in fp32 (log-probs must not be bf16-rounded)."""
    return project_logits(h_btd, self.unembedding())

  def __call__(self, tokens_bt, cache: KVCache | None = None, n_new_b=None, positions_bt=None,
               segment_ids_bt=None):
    h, cache = self.hidden(tokens_bt, cache, n_new_b, positions_bt, segment_ids_bt)
    return self.logits(h), cache


def _block_step(graphdef: nnx.GraphDef, remat: str, *, prevent_cse: bool):
  """A pure (params, x, pos, k, v, kv_len, segments) -> (x, k, v) of one block,
  under jax.checkpoint with the named policy unless remat is "none"."""
  def step(params, x, pos, kc, vc, kv_len, segment_ids_bt):
    return nnx.merge(graphdef, params)(x, pos, kc, vc, pos, kv_len, segment_ids_bt)
  if remat == "none":
    return step
  return jax.checkpoint(step, policy=REMAT_POLICY[remat], prevent_cse=prevent_cse)


def with_layout(model: "Transformer", scan_layers: bool) -> "Transformer":
  """The same weights in the other block layout (a new model; `model` is untouched)."""
  cfg = dataclasses.replace(model.cfg, scan_layers=scan_layers)
  target = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), lm_head=model.has_lm_head))
  graphdef, _ = nnx.split(target)
  return nnx.merge(graphdef, layout.to_layout(nnx.state(model), scan_layers))


def project_logits(h_btd: jax.Array, w_dv: jax.Array) -> jax.Array:
  """h @ W in W's dtype, returned in fp32 and sharded over the vocabulary."""
  out = jnp.einsum("btd,dv->btv", h_btd.astype(w_dv.dtype), w_dv, preferred_element_type=jnp.float32)
  return shard(out.astype(jnp.float32), ("batch", "length", "vocab"))


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array) -> jax.Array:
  """log p(target) under the logits, fp32."""
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, targets_bt[..., None], axis=-1)[..., 0]


def token_entropy(logits_btv: jax.Array) -> jax.Array:
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
