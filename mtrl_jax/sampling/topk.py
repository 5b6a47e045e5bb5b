"""Choosing the next token from logits: greedy, temperature, top-k, top-p.

Pure jnp, jitted as part of the decode loop. Each choice comes with its
behaviour log-prob: the log-prob under the distribution the token was really
drawn from (temperature and filters applied), which is what importance ratios
in the RL losses need. Greedy reports the plain (temperature 1) model log-prob.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtrl_jax.sampling.records import SamplingParams


class SampleMode(NamedTuple):
  """The static (compile-time) part of SamplingParams.

  top_k is static because `lax.top_k` needs a static k; the temperature and
  top_p values stay dynamic so changing them never recompiles.
  """
  greedy: bool
  top_k: int  # 0: no top-k filter
  nucleus: bool  # whether a top-p filter runs


def sample_mode(params: SamplingParams, vocab_size: int) -> SampleMode:
  if params.greedy:
    return SampleMode(True, 0, False)
  top_k = int(params.top_k) if 0 < params.top_k < vocab_size else 0
  return SampleMode(False, top_k, params.top_p < 1.0)


def keys_per_row(key: jax.Array) -> bool:
  """Whether `key` holds one PRNG key per batch row (typed [B] or raw uint32 [B, 2]) rather than one."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  return key.ndim == (1 if typed else 2)


def fold_in_rows(key: jax.Array, data) -> jax.Array:
  """`jax.random.fold_in` of one key, or of every row's key."""
  if keys_per_row(key):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, data)
  return jax.random.fold_in(key, data)


def _categorical(key: jax.Array, logits_bk: jax.Array) -> jax.Array:
  """One draw per row; with per-row keys, row b's draw depends only on key[b] and its own logits."""
  if keys_per_row(key):
    return jax.vmap(lambda k, l: jax.random.categorical(k, l, axis=-1))(key, logits_bk)
  return jax.random.categorical(key, logits_bk, axis=-1)


def _pick(x_bv: jax.Array, idx_b: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_bv, idx_b[:, None], axis=-1)[:, 0]


def nucleus_filter(sorted_logits_bk: jax.Array, top_p: jax.Array) -> jax.Array:
  """Keeps the shortest prefix of descending logits whose mass reaches top_p.

  A token survives when the mass strictly before it is < top_p, so the most
  likely token always survives; the rest become -inf.
  """
  probs = jax.nn.softmax(sorted_logits_bk, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = mass_before < top_p
  keep = keep.at[:, 0].set(True)
  return jnp.where(keep, sorted_logits_bk, -jnp.inf)


def choose_tokens(logits_bv: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array,
                  mode: SampleMode) -> tuple[jax.Array, jax.Array]:
  """(token ids int32 [B], behaviour log-probs fp32 [B]) for one decode step."""
  logits_bv = logits_bv.astype(jnp.float32)
  if mode.greedy:
    tok_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
    return tok_b, _pick(jax.nn.log_softmax(logits_bv, axis=-1), tok_b)
  scaled_bv = logits_bv / temperature
  if not mode.top_k and not mode.nucleus:
    tok_b = _categorical(key, scaled_bv).astype(jnp.int32)
    return tok_b, _pick(jax.nn.log_softmax(scaled_bv, axis=-1), tok_b)
  # Filter in sorted space: the support is then a prefix of positions, and
  # ties at the cut are broken by `lax.top_k`'s order instead of all kept.
  k = mode.top_k or scaled_bv.shape[-1]
  vals_bk, ids_bk = jax.lax.top_k(scaled_bv, k)
  if mode.nucleus:
    vals_bk = nucleus_filter(vals_bk, top_p)
  j_b = _categorical(key, vals_bk)
  tok_b = _pick(ids_bk, j_b).astype(jnp.int32)
  return tok_b, _pick(jax.nn.log_softmax(vals_bk, axis=-1), j_b)
