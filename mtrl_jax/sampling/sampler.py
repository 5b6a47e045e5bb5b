"""Host wrapper of the KV-cache sampler: multi-turn sessions, batched.

A `DecodeState` holds one KV cache row per session. Each turn the rollout
engine `append`s the new observation tokens of the rows that have one (only
those tokens are prefilled), then `generate`s an action for the active rows
in a single jitted call (the whole decode loop runs on device). The caches
start small and grow along a ladder of sizes up to the state's capacity, so
attention only reads slots that some row may use. Shapes are bucketed (chunk
length, decode buffer, allocated slots) so a long run compiles a bounded set
of programs; each new one is logged and counted.

    sampler = Sampler.from_model(policy, pad_id=tok.pad_id, stop_ids=[tok.eos_id])
    state = sampler.init_state(batch=16, capacity=1024)
    state = sampler.append(state, [tok.observation_ids(o, prompt) for o in obs])
    out, state = sampler.generate(state, rng, max_new_tokens=32)
"""
from __future__ import annotations

import threading
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from mtrl_jax.models.transformer import Transformer
from mtrl_jax.sampling import decode
from mtrl_jax.sampling import fork as fork_lib
from mtrl_jax.sampling.buckets import DEFAULT_LENGTH_BUCKETS, MIN_SLOTS, chunk_bucket, slots_bucket, steps_bucket
from mtrl_jax.sampling.records import DecodeState, GenerateOut, SamplingParams
from mtrl_jax.sampling.topk import keys_per_row, sample_mode

__all__ = ["Sampler", "SamplingParams", "DecodeState", "GenerateOut"]


def _shape_signature(tree) -> dict:
  return {jax.tree_util.keystr(path): (tuple(np.shape(x)), str(jnp.result_type(x)))
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


class Sampler:
  """Batched multi-turn decoding with per-row KV caches (see module doc).

  Args:
    graphdef, params: `nnx.split` of a policy `Transformer` (with an LM head).
    pad_id: id written into padding columns (never attended).
    stop_ids: ids that end a row's turn; the stop id itself is generated,
      returned and cached.
    length_buckets: allowed padded lengths of an appended chunk; longer
      appends are cut into chunks of the largest bucket.
    log_compiles: log each new compiled shape with absl (they are counted
      either way, see `compile_count`).
    version: version number of `params` (stamped by callers on the tokens).
  """

  def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, *, pad_id: int, stop_ids: Sequence[int],
               length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS, log_compiles: bool = True,
               version: int = 0):
    model = nnx.merge(graphdef, params)
    if not isinstance(model, Transformer) or not model.has_lm_head:
      raise ValueError("Sampler needs a policy Transformer with an LM head (graphdef/params of nnx.split)")
    self.cfg = model.cfg
    buckets = tuple(sorted({int(b) for b in length_buckets}))
    if not buckets or buckets[0] <= 0:
      raise ValueError(f"length_buckets must be non-empty and positive, got {list(length_buckets)}")
    if not 0 <= int(pad_id) < self.cfg.vocab_size:
      raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {self.cfg.vocab_size})")
    bad = [i for i in stop_ids if not 0 <= int(i) < self.cfg.vocab_size]
    if bad:
      raise ValueError(f"stop_ids {bad} are outside the vocabulary [0, {self.cfg.vocab_size})")
    self.graphdef = graphdef
    self.pad_id = int(pad_id)
    self.stop_ids = tuple(sorted({int(i) for i in stop_ids}))
    self.length_buckets = buckets
    self.log_compiles = log_compiles
    self._lock = threading.Lock()
    self._params, self._version = params, int(version)
    self._signature = _shape_signature(params)
    self._seen: dict[str, set] = {"append": set(), "generate": set(), "grow": set(), "fork": set()}

    def append_fn(params, state, tokens_bt, n_new_b):
      return decode.append_tokens(graphdef, params, state, tokens_bt, n_new_b)

    def generate_fn(params, state, rng, budget, active_b, temperature, top_p, steps, mode):
      return decode.generate_tokens(graphdef, params, state, rng, budget, active_b, temperature, top_p,
                                    stop_ids=self.stop_ids, pad_id=self.pad_id, steps=steps, mode=mode)

    self._append_jit = jax.jit(append_fn, donate_argnames=("state",))
    self._generate_jit = jax.jit(generate_fn, static_argnames=("steps", "mode"), donate_argnames=("state",))
    # Not donated: a bigger cache cannot reuse the old buffers.
    self._grow_jit = jax.jit(decode.grow_cache, static_argnames=("slots",))
    self._gather_jit = jax.jit(fork_lib.gather_rows)
    self._copy_jit = jax.jit(fork_lib.copy_rows, donate_argnames=("state",))

  @classmethod
  def from_model(cls, model: Transformer, **kw) -> "Sampler":
    graphdef, params = nnx.split(model)
    return cls(graphdef, params, **kw)

  # ---------------------------------------------------------------- weights
  @property
  def version(self) -> int:
    return self._version

  @property
  def params(self) -> nnx.State:
    return self._params

  def set_params(self, params, version: int) -> None:
    """Swaps in new policy weights (same shapes and dtypes: no recompile).

    `params` is an nnx.State of the same model (or the model itself). The
    swap of (params, version) is atomic for calls made from other threads.
    """
    if isinstance(params, nnx.Module):
      params = nnx.state(params)
    signature = _shape_signature(params)
    if signature != self._signature:
      diff = sorted(set(signature.items()) ^ set(self._signature.items()))
      raise ValueError(f"set_params: parameters differ in structure/shape/dtype at {diff[:4]}")
    with self._lock:
      self._params, self._version = params, int(version)

  # ------------------------------------------------------------------ state
  def init_state(self, batch: int, capacity: int) -> DecodeState:
    """Empty caches for `batch` sessions of up to `capacity` tokens each.

    Only the first few slots are allocated; later calls grow the caches as
    rows get longer (never past `capacity`).
    """
    if batch <= 0:
      raise ValueError(f"init_state: batch must be positive, got {batch}")
    if capacity <= 0:
      raise ValueError(f"init_state: capacity must be positive, got {capacity}")
    cache = nnx.merge(self.graphdef, self._params).init_cache(batch, min(capacity, MIN_SLOTS))
    return DecodeState(cache, jnp.zeros((batch, self.cfg.vocab_size), jnp.float32), jnp.int32(capacity))

  def lengths(self, state: DecodeState) -> np.ndarray:
    """int [B]: tokens cached per row."""
    return np.asarray(jax.device_get(state.cache.length_b))

  def _lengths_and_capacity(self, state: DecodeState) -> tuple[np.ndarray, int]:
    lengths_b, capacity = jax.device_get((state.cache.length_b, state.capacity))
    return np.asarray(lengths_b), int(capacity)

  def _fit(self, state: DecodeState, need: int, capacity: int) -> DecodeState:
    """Grows the caches to the ladder size that holds `need` tokens per row."""
    slots = slots_bucket(need, capacity)
    have = state.cache.capacity
    if slots <= have:
      return state
    self._note_shape("grow", (state.last_logits_bv.shape[0], have, slots))
    return self._grow_jit(state, slots=slots)

  def compile_count(self) -> dict:
    """Distinct shapes compiled so far per jitted function, and their sum."""
    with self._lock:
      counts = {name: len(keys) for name, keys in self._seen.items()}
    counts["total"] = sum(counts.values())
    return counts

  def _note_shape(self, name: str, key: tuple) -> None:
    with self._lock:
      if key in self._seen[name]:
        return
      self._seen[name].add(key)
      n = len(self._seen[name])
    if self.log_compiles:
      logging.info("sampler: compiling %s #%d for shape %s", name, n, key)

  # ------------------------------------------------------------------- fork
  def fork(self, state: DecodeState, parent_rows: Sequence[int], n: int) -> DecodeState:
    """A new state of len(parent_rows) * n rows: row i * n + j is child j of
    parent_rows[i], with the parent's cache contents, length and next-token
    logits, so it continues exactly as the parent would. `state` stays valid.
    """
    parents = np.asarray(parent_rows, np.int64).reshape(-1)
    batch = state.last_logits_bv.shape[0]
    if n < 1 or parents.size == 0:
      raise ValueError(f"fork: need at least one parent row and n >= 1, got {parents.size} rows, n={n}")
    if parents.min() < 0 or parents.max() >= batch:
      raise ValueError(f"fork: parent rows {parents.tolist()} outside [0, {batch})")
    src = np.repeat(parents, int(n)).astype(np.int32)
    self._note_shape("fork", ("gather", batch, state.cache.capacity, src.size))
    return self._gather_jit(state, jnp.asarray(src))

  def copy_rows(self, state: DecodeState, src_rows: Sequence[int], dst_rows: Sequence[int]) -> DecodeState:
    """Forks in place: row dst_rows[i] becomes a copy of row src_rows[i]
    (same batch size, so no new programs for append/generate). Sources are
    read before any row is written. The passed state is donated.
    """
    src = np.asarray(src_rows, np.int64).reshape(-1)
    dst = np.asarray(dst_rows, np.int64).reshape(-1)
    batch = state.last_logits_bv.shape[0]
    if src.shape != dst.shape:
      raise ValueError(f"copy_rows: {src.size} source rows for {dst.size} destinations")
    if src.size == 0:
      return state
    if min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= batch:
      raise ValueError(f"copy_rows: rows outside [0, {batch}): src {src.tolist()}, dst {dst.tolist()}")
    if len(set(dst.tolist())) != dst.size:
      raise ValueError(f"copy_rows: destination rows repeat: {dst.tolist()}")
    # Padded to a power of two (repeating the last pair) to bound the compiled shapes.
    size = 1 << (int(src.size) - 1).bit_length()
    src = np.concatenate([src, np.full(size - src.size, src[-1])]).astype(np.int32)
    dst = np.concatenate([dst, np.full(size - dst.size, dst[-1])]).astype(np.int32)
    self._note_shape("fork", ("copy", batch, state.cache.capacity, size))
    return self._copy_jit(state, jnp.asarray(src), jnp.asarray(dst))

  # ----------------------------------------------------------------- append
  def append(self, state: DecodeState, new_tokens: Sequence[Sequence[int]]) -> DecodeState:
    """Row b caches new_tokens[b] after its current tokens ([] leaves it alone).

    Only the new tokens are run through the model. Raises ValueError naming
    the row when a row would pass the capacity or holds an id outside the
    vocabulary. The passed state is donated: use the returned one.
    """
    batch = state.last_logits_bv.shape[0]
    if len(new_tokens) != batch:
      raise ValueError(f"append: new_tokens has {len(new_tokens)} rows, the state has {batch}")
    rows = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids in new_tokens]
    n_b = np.array([len(r) for r in rows], np.int64)
    if n_b.max(initial=0) == 0:
      return state
    for b, ids in enumerate(rows):
      if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
        raise ValueError(f"append: row {b} has token ids outside [0, {self.cfg.vocab_size})")
    lengths_b, capacity = self._lengths_and_capacity(state)
    over = np.flatnonzero(lengths_b + n_b > capacity)
    if over.size:
      r = int(over[0])
      raise ValueError(f"append: row {r} holds {lengths_b[r]} tokens, appending {n_b[r]} more "
                       f"exceeds the cache capacity {capacity} (rows over: {over.tolist()})")
    params = self._params
    chunk = self.length_buckets[-1]
    for start in range(0, int(n_b.max()), chunk):
      part_b = np.clip(n_b - start, 0, chunk)
      t = chunk_bucket(int(part_b.max()), self.length_buckets)
      tokens_bt = np.full((batch, t), self.pad_id, np.int32)
      for b in np.flatnonzero(part_b):
        tokens_bt[b, :part_b[b]] = rows[b][start:start + part_b[b]]
      ends_b = lengths_b + np.minimum(n_b, start) + part_b
      state = self._fit(state, int(ends_b[part_b > 0].max()), capacity)
      self._note_shape("append", (batch, state.cache.capacity, t))
      state = self._append_jit(params, state, jnp.asarray(tokens_bt), jnp.asarray(part_b, jnp.int32))
    return state

  # --------------------------------------------------------------- generate
  def generate(self, state: DecodeState, rng: jax.Array, max_new_tokens: int,
               active: np.ndarray | None = None,
               params: SamplingParams = SamplingParams()) -> tuple[GenerateOut, DecodeState]:
    """Decodes up to `max_new_tokens` for each active row, in one device call.

    A row stops after a stop id, after max_new_tokens, or when it holds
    `capacity` tokens; its generated tokens (stop id included) are cached, so
    the next `append` continues after them. Inactive rows generate nothing and
    keep their cache and logits. The passed state is donated: use the
    returned one. `rng` is one key, or one key per row ([B] typed keys):
    then each row's draws depend only on its own key.
    """
    batch = state.last_logits_bv.shape[0]
    active_b = np.ones(batch, bool) if active is None else np.asarray(active, bool).reshape(-1)
    if active_b.shape != (batch,):
      raise ValueError(f"generate: active has shape {np.shape(active)}, expected ({batch},)")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
      raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens}")
    max_new_tokens = int(max_new_tokens)
    lengths_b, capacity = self._lengths_and_capacity(state)
    empty = np.flatnonzero(active_b & (lengths_b == 0))
    if empty.size:
      raise ValueError(f"generate: active row {int(empty[0])} has an empty cache; append a prompt first "
                       f"(empty active rows: {empty.tolist()})")
    if max_new_tokens == 0 or not active_b.any():
      no_tokens = [np.zeros((0,), np.int32) for _ in range(batch)]
      no_logps = [np.zeros((0,), np.float32) for _ in range(batch)]
      full_b = active_b & (lengths_b >= capacity)
      hit_b = active_b & (max_new_tokens == 0) & ~full_b
      return GenerateOut(no_tokens, no_logps, hit_b, full_b), state

    mode = sample_mode(params, self.cfg.vocab_size)
    steps = steps_bucket(max_new_tokens)
    state = self._fit(state, int(np.minimum(lengths_b[active_b] + max_new_tokens, capacity).max()), capacity)
    rng = jnp.asarray(rng)
    if keys_per_row(rng) and rng.shape[0] != batch:
      raise ValueError(f"generate: {rng.shape[0]} per-row keys for a batch of {batch} rows")
    self._note_shape("generate", (batch, state.cache.capacity, steps, mode, rng.shape, str(rng.dtype)))
    with self._lock:
      weights = self._params
    state, out = self._generate_jit(weights, state, rng, jnp.int32(max_new_tokens), jnp.asarray(active_b),
                                    jnp.float32(params.temperature), jnp.float32(params.top_p),
                                    steps=steps, mode=mode)
    out = jax.device_get(out)
    tokens = [out.tokens_bn[b, :out.n_gen_b[b]].astype(np.int32) for b in range(batch)]
    logps = [out.logps_bn[b, :out.n_gen_b[b]].astype(np.float32) for b in range(batch)]
    return GenerateOut(tokens, logps, np.asarray(out.hit_budget_b), np.asarray(out.ended_by_capacity_b)), state
