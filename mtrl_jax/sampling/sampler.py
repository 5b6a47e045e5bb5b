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

import dataclasses
import threading
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from mtrl_jax.compile.programs import Program, shared
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.sampling import decode
from mtrl_jax.sampling import fork as fork_lib
from mtrl_jax.sampling import row_steps
from mtrl_jax.sampling.buckets import DEFAULT_LENGTH_BUCKETS, MIN_SLOTS, chunk_bucket, slots_bucket, steps_bucket
from mtrl_jax.sampling.records import DecodeState, GenerateOut, SamplingParams
from mtrl_jax.sampling.topk import keys_per_row, sample_mode

__all__ = ["Sampler", "SamplingParams", "DecodeState", "GenerateOut", "RowStepsResult"]


class RowStepsResult(NamedTuple):
  """Host-side result of one `Sampler.decode_rows` call (numpy)."""
  tokens: list  # per row: int32 ids generated in this call ([] when inactive)
  logps: list  # per row: fp32 behaviour log-prob of each id
  done: np.ndarray  # bool [B]: the row's action ended (stop id, budget or full cache)
  stopped: np.ndarray  # bool [B]: it ended on a stop id
  hit_budget: np.ndarray  # bool [B]: it ended on its budget
  full: np.ndarray  # bool [B]: it ended on a full cache
  steps: int  # decode steps the call ran (every row pays for each)
  version: int  # version of the weights that decoded these tokens


def _shape_signature(tree) -> dict:
  return {jax.tree_util.keystr(path): (tuple(np.shape(x)), str(jnp.result_type(x)))
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


@dataclasses.dataclass(frozen=True)
class DecodePrograms(Program):
  """The sampler's jitted halves (append, generate, rows, append_rows): they depend only on the
  model's structure, the stop ids and the pad id, so every sampler of equal ones in this process
  (another run, another seed) shares them and what they compiled (mtrl_jax/compile/programs.py).

  They close over these fields only (never a Sampler: a shared program would keep its weights alive).
  """
  graphdef: nnx.GraphDef
  stop_ids: tuple
  pad_id: int

  def build(self) -> tuple:
    graphdef, stop_ids, pad_id = self.graphdef, self.stop_ids, self.pad_id

    def append_fn(params, state, tokens_bt, n_new_b):
      return decode.append_tokens(graphdef, params, state, tokens_bt, n_new_b)

    def generate_fn(params, state, rng, budget, active_b, temperature, top_p, steps, mode):
      return decode.generate_tokens(graphdef, params, state, rng, budget, active_b, temperature, top_p,
                                    stop_ids=stop_ids, pad_id=pad_id, steps=steps, mode=mode)

    def rows_fn(params, state, keys_b, offset_b, budget_b, active_b, temperature, top_p, done_quota, steps, mode):
      return row_steps.decode_row_steps(graphdef, params, state, keys_b, offset_b, budget_b, active_b,
                                        temperature, top_p, done_quota, stop_ids=stop_ids,
                                        pad_id=pad_id, steps=steps, mode=mode)

    def append_rows_fn(params, state, rows_k, tokens_kt, n_new_k):
      return row_steps.append_to_rows(graphdef, params, state, rows_k, tokens_kt, n_new_k)

    return (jax.jit(append_fn, donate_argnames=("state",)),
            jax.jit(generate_fn, static_argnames=("steps", "mode"), donate_argnames=("state",)),
            jax.jit(rows_fn, static_argnames=("steps", "mode"), donate_argnames=("state",)),
            jax.jit(append_rows_fn, donate_argnames=("state",)))


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
    mesh: the devices the sampler's states live on (its own devices when
      `rollout.devices` splits them from the learner's,
      parallel/device_split.py); rows are split over the mesh's first axis
      when the batch divides it, else replicated. None: the default device.
  """

  def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, *, pad_id: int, stop_ids: Sequence[int],
               length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS, log_compiles: bool = True,
               version: int = 0, mesh=None):
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
    self.mesh = mesh
    self._lock = threading.Lock()
    self._params, self._version = params, int(version)
    self._signature = _shape_signature(params)
    self._seen: dict[str, set] = {"append": set(), "generate": set(), "grow": set(), "fork": set(),
                                  "rows": set(), "move": set()}

    # Shared with every sampler of this process of equal structure, stop ids and pad id.
    (self._append_jit, self._generate_jit, self._rows_jit,
     self._append_rows_jit) = shared(DecodePrograms(graphdef, self.stop_ids, self.pad_id))
    # Not donated: a bigger cache cannot reuse the old buffers.
    self._grow_jit = jax.jit(decode.grow_cache, static_argnames=("slots",))
    self._gather_jit = jax.jit(fork_lib.gather_rows)
    self._copy_jit = jax.jit(fork_lib.copy_rows, donate_argnames=("state",))
    self._move_jit = jax.jit(fork_lib.move_rows, donate_argnames=("dst",))
    self._clear_jit = jax.jit(fork_lib.clear_rows, donate_argnames=("state",))

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

  def weights(self, latest: bool = True) -> tuple[nnx.State, int]:
    """(params, version), read together: what a call made now decodes with.

    `latest` means nothing here (the actor pool's `ActorSampler` loads the
    newest published weights first when it is set).
    """
    del latest
    with self._lock:
      return self._params, self._version

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
    state = DecodeState(cache, jnp.zeros((batch, self.cfg.vocab_size), jnp.float32), jnp.int32(capacity))
    return state if self.mesh is None else jax.device_put(state, fork_lib.state_shardings(state, self.mesh))

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
    return self._gather_jit(state, np.asarray(src))

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
    return self._copy_jit(state, np.asarray(src), np.asarray(dst))

  # ----------------------------------------------------------------- append
  def append(self, state: DecodeState, new_tokens: Sequence[Sequence[int]], weights=None) -> DecodeState:
    """Row b caches new_tokens[b] after its current tokens ([] leaves it alone).

    Only the new tokens are run through the model. Raises ValueError naming
    the row when a row would pass the capacity or holds an id outside the
    vocabulary. The passed state is donated: use the returned one.
    `weights`: params to prefill with (default: the current ones).
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
    params = self._params if weights is None else weights
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
      state = self._append_jit(params, state, np.asarray(tokens_bt), np.asarray(part_b, np.int32))
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
    state, out = self._generate_jit(weights, state, rng, jnp.int32(max_new_tokens), np.asarray(active_b),
                                    jnp.float32(params.temperature), jnp.float32(params.top_p),
                                    steps=steps, mode=mode)
    out = jax.device_get(out)
    tokens = [out.tokens_bn[b, :out.n_gen_b[b]].astype(np.int32) for b in range(batch)]
    logps = [out.logps_bn[b, :out.n_gen_b[b]].astype(np.float32) for b in range(batch)]
    return GenerateOut(tokens, logps, np.asarray(out.hit_budget_b), np.asarray(out.ended_by_capacity_b)), state

  # ------------------------------------------------------ continuous batching
  def decode_rows(self, state: DecodeState, keys: jax.Array, offsets: Sequence[int], budgets: Sequence[int],
                  active: np.ndarray, steps: int, params: SamplingParams = SamplingParams(),
                  weights: tuple | None = None, done_quota: int = 0) -> tuple[RowStepsResult, DecodeState]:
    """At most `steps` decode steps of each active row, each at its own place in its action.

    keys: [B] typed keys, one per row (row b's token i of its action draws
    with `fold_in(keys[b], i)`, as `generate` with per-row keys does);
    offsets: tokens each row already generated for its current action;
    budgets: each row's token budget for the whole action. A row's action
    ends on a stop id, on its budget or on a full cache (`done`).
    done_quota > 0: return as soon as that many rows' actions ended. `weights`:
    a (params, version) pair from `weights()` (default: the current ones).
    The passed state is donated: use the returned one.
    See sampling/row_steps.py.
    """
    batch = state.last_logits_bv.shape[0]
    active_b = np.asarray(active, bool).reshape(-1)
    offset_b = np.asarray(offsets, np.int64).reshape(-1)
    budget_b = np.asarray(budgets, np.int64).reshape(-1)
    for name, x in (("active", active_b), ("offsets", offset_b), ("budgets", budget_b)):
      if x.shape != (batch,):
        raise ValueError(f"decode_rows: {name} has shape {x.shape}, expected ({batch},)")
    if int(steps) != steps or steps < 1:
      raise ValueError(f"decode_rows: steps must be an integer >= 1, got {steps}")
    keys = jnp.asarray(keys)
    if not keys_per_row(keys) or keys.shape[0] != batch:
      raise ValueError(f"decode_rows: keys must hold one key per row ({batch}), got shape {keys.shape}")
    lengths_b, capacity = self._lengths_and_capacity(state)
    empty = np.flatnonzero(active_b & (lengths_b == 0))
    if empty.size:
      raise ValueError(f"decode_rows: active row {int(empty[0])} has an empty cache; append a prompt first")
    weights_now, version = self.weights() if weights is None else weights
    if not active_b.any():
      none = [np.zeros((0,), np.int32) for _ in range(batch)]
      nolp = [np.zeros((0,), np.float32) for _ in range(batch)]
      zeros = np.zeros(batch, bool)
      return RowStepsResult(none, nolp, zeros, zeros, zeros, zeros, 0, int(version)), state
    mode = sample_mode(params, self.cfg.vocab_size)
    buf = steps_bucket(int(steps))
    left_b = np.maximum(np.minimum(budget_b - offset_b, int(steps)), 0)
    state = self._fit(state, int(np.minimum(lengths_b[active_b] + left_b[active_b], capacity).max()), capacity)
    self._note_shape("rows", (batch, state.cache.capacity, buf, mode))
    # The loop runs `steps` iterations at most; the buffer is the bucketed size.
    budget_now = np.minimum(budget_b, offset_b + int(steps))
    state, out = self._rows_jit(weights_now, state, keys, np.asarray(offset_b, np.int32),
                                np.asarray(budget_now, np.int32), np.asarray(active_b),
                                jnp.float32(params.temperature), jnp.float32(params.top_p),
                                jnp.int32(done_quota), steps=buf, mode=mode)
    out = jax.device_get(out)
    n = np.asarray(out.n_gen_b)
    tokens = [out.tokens_bn[b, :n[b]].astype(np.int32) for b in range(batch)]
    logps = [out.logps_bn[b, :n[b]].astype(np.float32) for b in range(batch)]
    # A row that used up this call's steps but not its own budget goes on next call.
    hit_budget = np.asarray(out.hit_budget_b) & (offset_b + n >= budget_b)
    stopped, full = np.asarray(out.stopped_b), np.asarray(out.full_b)
    done = active_b & (stopped | hit_budget | full)
    return RowStepsResult(tokens, logps, done, stopped, hit_budget, full, int(out.steps_run), int(version)), state

  def append_rows(self, state: DecodeState, rows: Sequence[int], new_tokens: Sequence[Sequence[int]],
                  weights=None) -> DecodeState:
    """Row rows[i] caches new_tokens[i]; only those rows run through the model.

    Same result as `append` with [] for every other row, at the cost of the
    given rows (padded to a power of two with other rows that append
    nothing). The passed state is donated. `weights`: params to prefill with.
    """
    batch = state.last_logits_bv.shape[0]
    rows = [int(r) for r in rows]
    if len(rows) != len(new_tokens):
      raise ValueError(f"append_rows: {len(rows)} rows for {len(new_tokens)} token lists")
    if not rows:
      return state
    if len(set(rows)) != len(rows) or min(rows) < 0 or max(rows) >= batch:
      raise ValueError(f"append_rows: rows {rows} must be distinct and in [0, {batch})")
    k = min(1 << (len(rows) - 1).bit_length(), batch)
    if 2 * len(rows) > batch:  # most of the batch: a plain append wastes less than the gather
      full = [[] for _ in range(batch)]
      for r, ids in zip(rows, new_tokens):
        full[r] = ids
      return self.append(state, full, weights=weights)
    pad = [r for r in range(batch) if r not in set(rows)][:k - len(rows)]
    ids_k = [np.asarray(t, np.int64).reshape(-1) for t in new_tokens] + [np.zeros(0, np.int64)] * len(pad)
    rows_k = np.asarray(rows + pad, np.int32)
    n_k = np.array([len(t) for t in ids_k], np.int64)
    for r, ids in zip(rows, ids_k):
      if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
        raise ValueError(f"append_rows: row {r} has token ids outside [0, {self.cfg.vocab_size})")
    lengths_b, capacity = self._lengths_and_capacity(state)
    over = [r for r, n in zip(rows, n_k) if lengths_b[r] + n > capacity]
    if over:
      raise ValueError(f"append_rows: rows {over} would exceed the cache capacity {capacity}")
    params = self._params if weights is None else weights
    chunk = self.length_buckets[-1]
    for start in range(0, int(n_k.max()), chunk):
      part_k = np.clip(n_k - start, 0, chunk)
      t = chunk_bucket(int(part_k.max()), self.length_buckets)
      tokens_kt = np.full((k, t), self.pad_id, np.int32)
      for i in np.flatnonzero(part_k):
        tokens_kt[i, :part_k[i]] = ids_k[i][start:start + part_k[i]]
      ends = lengths_b[rows_k] + np.minimum(n_k, start) + part_k
      state = self._fit(state, int(ends[part_k > 0].max()), capacity)
      self._note_shape("append", ("rows", batch, k, state.cache.capacity, t))
      state = self._append_rows_jit(params, state, np.asarray(rows_k), np.asarray(tokens_kt),
                                    np.asarray(part_k, np.int32))
    return state

  def clear_rows(self, state: DecodeState, rows: Sequence[int]) -> DecodeState:
    """Empties rows (length 0) so new sessions start there. The state is donated."""
    idx = self._row_index(rows, state.last_logits_bv.shape[0], "clear_rows")
    if idx is None:
      return state
    self._note_shape("move", ("clear", state.last_logits_bv.shape[0], state.cache.capacity, idx.size))
    return self._clear_jit(state, np.asarray(idx))

  def move_rows(self, src: DecodeState, src_rows: Sequence[int], dst: DecodeState,
                dst_rows: Sequence[int]) -> tuple[DecodeState, DecodeState]:
    """Copies rows of one state into rows of another: (src, dst) after the move.

    Row dst_rows[i] of `dst` becomes row src_rows[i] of `src` (cache,
    length, logits). The smaller of the two caches is first grown to the
    other's allocated slots (so `src` may come back as a new state); `dst`
    is donated.
    """
    s_idx = self._row_index(src_rows, src.last_logits_bv.shape[0], "move_rows (src)", unique=False)
    d_idx = self._row_index(dst_rows, dst.last_logits_bv.shape[0], "move_rows (dst)")
    if (s_idx is None) != (d_idx is None) or (s_idx is not None and s_idx.size != d_idx.size):
      raise ValueError(f"move_rows: {len(src_rows)} source rows for {len(dst_rows)} destinations")
    if s_idx is None:
      return src, dst
    slots = max(src.cache.capacity, dst.cache.capacity)
    if src.cache.capacity < slots:
      self._note_shape("grow", (src.last_logits_bv.shape[0], src.cache.capacity, slots))
      src = self._grow_jit(src, slots=slots)
    if dst.cache.capacity < slots:
      self._note_shape("grow", (dst.last_logits_bv.shape[0], dst.cache.capacity, slots))
      dst = self._grow_jit(dst, slots=slots)
    self._note_shape("move", ("move", src.last_logits_bv.shape[0], dst.last_logits_bv.shape[0], slots,
                              s_idx.size))
    return src, self._move_jit(src, np.asarray(s_idx), dst, np.asarray(d_idx))

  @staticmethod
  def _row_index(rows: Sequence[int], batch: int, what: str, unique: bool = True) -> np.ndarray | None:
    """int32 row indices padded to a power of two (the last repeated: bounded shapes), or None if empty."""
    idx = np.asarray(rows, np.int64).reshape(-1)
    if idx.size == 0:
      return None
    if idx.min() < 0 or idx.max() >= batch:
      raise ValueError(f"{what}: rows {idx.tolist()} outside [0, {batch})")
    if unique and len(set(idx.tolist())) != idx.size:
      raise ValueError(f"{what}: rows repeat: {idx.tolist()}")
    size = 1 << (int(idx.size) - 1).bit_length()
    return np.concatenate([idx, np.full(size - idx.size, idx[-1])]).astype(np.int32)
