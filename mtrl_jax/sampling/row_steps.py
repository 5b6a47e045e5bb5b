"""Per-row decode steps: the device half of continuous batching.

`decode.generate_tokens` decodes one whole action for every active row and
returns when the last row stops, so a row that stops early idles until the
longest action of the batch is done. Here every row carries its own place in
its action (`offset_b`: tokens it already generated in earlier calls) and its
own budget, and one call runs at most `steps` decode steps. A scheduler
(rollout/continuous.py) calls it again and again, refilling the rows whose
action ended in between, so the batch stays full.

Sampling keys: token i of a row's action draws with `fold_in(key_b, i)`,
counted from the action's first token whatever call produced it. The lockstep
`generate` draws token i with `fold_in(key_b, i)` too (all its rows start at
step 0), so a session decoded in pieces here draws the same tokens as decoded
in one `generate` call, given the same per-row key.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from mtrl_jax.sampling import decode
from mtrl_jax.sampling.records import DecodeState
from mtrl_jax.sampling.topk import SampleMode


class RowStepsOut(NamedTuple):
  """What one call produced, still on device; rows are right-padded."""
  tokens_bn: jax.Array  # int32, pad after each row's n_gen_b tokens
  logps_bn: jax.Array  # fp32 behaviour log-probs, 0 after n_gen_b
  n_gen_b: jax.Array  # int32 tokens generated per row in this call
  stopped_b: jax.Array  # bool: the row's last token is a stop id
  hit_budget_b: jax.Array  # bool: offset + generated reached the budget (no stop id)
  full_b: jax.Array  # bool: the row's cache is full (no stop id, budget not reached)
  steps_run: jax.Array  # int32 []: loop iterations this call ran (<= steps)


def decode_row_steps(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState, keys_b: jax.Array,
                     offset_b: jax.Array, budget_b: jax.Array, active_b: jax.Array, temperature: jax.Array,
                     top_p: jax.Array, done_quota: jax.Array, *, stop_ids: Sequence[int], pad_id: int, steps: int,
                     mode: SampleMode) -> tuple[DecodeState, RowStepsOut]:
  """Up to `steps` decode steps of every active row (see module doc).

  A row runs while it is active, has not sampled a stop id, has generated
  fewer than `budget_b - offset_b` tokens in this call and its cache is not
  full; the loop exits early once no row runs, or once `done_quota` (> 0)
  rows have stopped running (the scheduler has sessions waiting for rows:
  better to hand them the freed rows now than at the end of the chunk).
  Every generated token (stop
  id included) is cached, so the next call continues after it. Inactive rows
  keep their cache and logits. `keys_b` holds one typed key per row. The
  caller guarantees min(capacity, length_b + budget_b - offset_b, length_b +
  steps) fits the allocated slots of active rows.
  """
  def draw_keys(step, n_gen_b):
    # A running row's next token is token offset + n_gen of its action (n_gen == step while it runs).
    return jax.vmap(jax.random.fold_in)(keys_b, offset_b + n_gen_b)

  def stop_early(started_b, running_b):
    freed = jnp.sum(started_b & ~running_b)  # rows whose action ended in this call
    return (done_quota > 0) & (freed >= done_quota)

  out = decode.decode_loop(nnx.merge(graphdef, params), state, active_b, budget_b - offset_b, draw_keys, temperature,
                           top_p, stop_ids=stop_ids, pad_id=pad_id, steps=steps, mode=mode, stop_early=stop_early)
  return out.state, RowStepsOut(out.tokens_bn, out.logps_bn, out.n_gen_b, out.stopped_b, out.hit_budget_b,
                                out.full_b, out.steps_run)


def append_to_rows(graphdef: nnx.GraphDef, params: nnx.State, state: DecodeState, rows_k: jax.Array,
                   tokens_kt: jax.Array, n_new_k: jax.Array) -> DecodeState:
  """`decode.append_tokens` on k rows of the batch only: row rows_k[i] caches
  tokens_kt[i, :n_new_k[i]].

  The continuous scheduler prefills the few rows it just refilled; running
  the whole batch through the model for them would pad every other row
  (a 300-token prompt prefilled in one row of 16 costs 16 rows' work). The
  k rows are gathered, prefilled and written back; `rows_k` must not repeat.
  """
  from mtrl_jax.sampling import fork
  sub = fork.gather_rows(state, rows_k)
  sub = decode.append_tokens(graphdef, params, sub, tokens_kt, n_new_k)
  return fork.move_rows(sub, jnp.arange(rows_k.shape[0]), state, rows_k)
