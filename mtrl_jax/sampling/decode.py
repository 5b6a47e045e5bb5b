"""The jitted halves of the sampler: prefill new tokens into per-row caches,
a whole multi-token decode in one `lax.while_loop`, and growing the caches.

All are pure functions of (graphdef, params, state, ...) so the host wrapper
(sampler.py) can jit them with static shapes and donate the state. They work
on the cache arrays as allocated: the host grows them (`grow_cache`) before a
call that needs more slots, so no call slices or copies the cache.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from mtrl_jax.models.transformer import KVCache
from mtrl_jax.sampling.records import DecodeState
from mtrl_jax.sampling.topk import SampleMode, choose_tokens, fold_in_rows

# KVCache keys/values are [B, KV, S, hd] per layer (a tuple), or [L, B, KV, S, hd]
# for a scanned model: counted from the end, the slot axis is the same in both.
_SLOT_AXIS = -2


class DecodeOut(NamedTuple):
  """What one decode loop produced, still on device; rows are right-padded."""
  tokens_bn: jax.Array  # int32, pad after each row's n_gen_b tokens
  logps_bn: jax.Array  # fp32 behaviour log-probs, 0 after n_gen_b
  n_gen_b: jax.Array  # int32 tokens generated per row
  hit_budget_b: jax.Array  # bool
  ended_by_capacity_b: jax.Array  # bool


def grow_cache(state: DecodeState, *, slots: int) -> DecodeState:
  """The same state with `slots` allocated cache slots per row (>= now)."""
  def grow(x):
    pad = [(0, 0)] * x.ndim
    pad[_SLOT_AXIS] = (0, slots - x.shape[_SLOT_AXIS])
    return jnp.pad(x, pad)
  cache = state.cache
  # tree.map keeps the layout: a tuple stays a tuple, a stacked array one array.
  return state._replace(cache=KVCache(jax.tree.map(grow, cache.k), jax.tree.map(grow, cache.v), cache.length_b))


def append_tokens(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState, tokens_bt: jax.Array,
                  n_new_b: jax.Array) -> DecodeState:
  """Row b caches tokens_bt[b, :n_new_b[b]]; the rest of its columns are padding.

  Only the new tokens run through the model (they attend to the cached
  prefix). Rows with n_new_b == 0 keep their logits and their valid slots.
  The caller guarantees length_b + n_new_b fits the allocated slots.
  """
  model = nnx.merge(graphdef, params)
  h_btd, cache = model.hidden(tokens_bt, state.cache, n_new_b)
  last_b = jnp.maximum(n_new_b - 1, 0)
  h_b1d = jnp.take_along_axis(h_btd, last_b[:, None, None], axis=1)
  logits_bv = model.logits(h_b1d)[:, 0]
  logits_bv = jnp.where(n_new_b[:, None] > 0, logits_bv, state.last_logits_bv)
  return DecodeState(cache, logits_bv, state.capacity)


class LoopOut(NamedTuple):
  """What `decode_loop` ran and produced (on device)."""
  steps_run: jax.Array  # int32 []: loop iterations run
  state: DecodeState  # the caches after every generated token, and each row's last logits
  tokens_bn: jax.Array  # int32, pad after each row's n_gen_b tokens
  logps_bn: jax.Array  # fp32 behaviour log-probs, 0 after n_gen_b
  n_gen_b: jax.Array  # int32 tokens generated per row in this call
  stopped_b: jax.Array  # bool: the row's last token is a stop id
  hit_budget_b: jax.Array  # bool: it generated all it had left (no stop id)
  full_b: jax.Array  # bool: its cache is full (no stop id, budget left)


def decode_loop(model, state: DecodeState, active_b: jax.Array, left_b: jax.Array, draw_keys: Callable,
                temperature: jax.Array, top_p: jax.Array, *, stop_ids: Sequence[int], pad_id: int, steps: int,
                mode: SampleMode, stop_early: Callable | None = None) -> LoopOut:
  """The decode body of `generate_tokens` and row_steps.decode_row_steps: up to `steps` steps of
  every running row, in one `lax.while_loop`.

  A row runs while it is active, has not sampled a stop id, has generated fewer than
  `left_b` tokens in this call (a scalar or [B]) and its cache is not full. Each step
  samples from every row's last logits with the keys `draw_keys(step, n_gen_b)`, then
  feeds the sampled token back through the model as a T=1 append, so every generated
  token (stop id included) is in the cache and the logits are always the prediction
  after the last cached token. The loop exits once no row runs, or when
  `stop_early(started_b, running_b)` (a traced bool) says so.
  """
  capacity = state.capacity
  batch = active_b.shape[0]
  stop_s = jnp.asarray(tuple(stop_ids), jnp.int32)
  running_b = active_b & (state.cache.length_b < capacity) & (left_b > 0)
  started_b = running_b
  zeros_b = jnp.zeros((batch,), jnp.int32)
  init = (jnp.int32(0), state.cache, state.last_logits_bv, running_b, zeros_b, jnp.zeros((batch,), bool),
          jnp.full((batch, steps), pad_id, jnp.int32), jnp.zeros((batch, steps), jnp.float32))

  def cond(carry):
    step, _, _, running_b = carry[:4]
    go = (step < steps) & jnp.any(running_b)
    return go if stop_early is None else go & ~stop_early(started_b, running_b)

  def body(carry):
    step, cache, logits_bv, running_b, n_gen_b, stopped_b, tokens_bn, logps_bn = carry
    tok_b, logp_b = choose_tokens(logits_bv, draw_keys(step, n_gen_b), temperature, top_p, mode)
    tok_b = jnp.where(running_b, tok_b, pad_id)
    logp_b = jnp.where(running_b, logp_b, 0.0)
    tokens_bn = jax.lax.dynamic_update_slice_in_dim(tokens_bn, tok_b[:, None], step, axis=1)
    logps_bn = jax.lax.dynamic_update_slice_in_dim(logps_bn, logp_b[:, None], step, axis=1)
    h_b1d, cache = model.hidden(tok_b[:, None], cache, running_b.astype(jnp.int32))
    logits_bv = jnp.where(running_b[:, None], model.logits(h_b1d)[:, 0], logits_bv)
    n_gen_b = n_gen_b + running_b
    hit_stop_b = running_b & jnp.any(tok_b[:, None] == stop_s[None, :], axis=-1)
    stopped_b = stopped_b | hit_stop_b
    running_b = running_b & ~hit_stop_b & (n_gen_b < left_b) & (cache.length_b < capacity)
    return step + 1, cache, logits_bv, running_b, n_gen_b, stopped_b, tokens_bn, logps_bn

  steps_run, cache, logits_bv, _, n_gen_b, stopped_b, tokens_bn, logps_bn = jax.lax.while_loop(cond, body, init)
  # A row that meets its budget and the capacity on the same token counts as budget.
  hit_budget_b = active_b & ~stopped_b & (n_gen_b >= left_b)
  full_b = active_b & ~stopped_b & ~hit_budget_b & (cache.length_b >= capacity)
  return LoopOut(steps_run, DecodeState(cache, logits_bv, capacity), tokens_bn, logps_bn, n_gen_b, stopped_b,
                 hit_budget_b, full_b)


def generate_tokens(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState, rng: jax.Array,
                    budget: jax.Array, active_b: jax.Array, temperature: jax.Array, top_p: jax.Array, *,
                    stop_ids: Sequence[int], pad_id: int, steps: int,
                    mode: SampleMode) -> tuple[DecodeState, DecodeOut]:
  """Decodes every active row until a stop id, `budget` tokens or a full row (`decode_loop`).

  The loop exits as soon as no row is running. Step i draws with `fold_in(rng, i)`; with
  one key per row (`rng` of shape [B]) each row draws from its own key, so a row's tokens
  do not depend on which other rows share its batch. The caller guarantees
  min(capacity, length_b + budget) fits the allocated slots of active rows.
  """
  out = decode_loop(nnx.merge(graphdef, params), state, active_b, budget, lambda step, _: fold_in_rows(rng, step),
                    temperature, top_p, stop_ids=stop_ids, pad_id=pad_id, steps=steps, mode=mode)
  return out.state, DecodeOut(out.tokens_bn, out.logps_bn, out.n_gen_b, out.hit_budget_b, out.full_b)
