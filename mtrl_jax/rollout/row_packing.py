"""Several samples per row: first-fit-decreasing packing and its inverse.

`rollout.packing.pack_sessions` lays out one sample (session, or turn) per
row, padded to the longest; with sessions of very different lengths most of
the batch is padding. Here the samples of such a batch are placed end to end
into rows of the same length L (first fit, longest first), and each token
carries the id of its segment (1, 2, ... within the row; 0 on padding), so
attention can be kept inside a segment (`segment_ids_bt` of the model).

The `RowPlan` maps every packed slot back to (sample row, column) of the
one-sample-per-row layout, so per-token arrays travel both ways:

    plan = plan_rows(pb.length_b, row_len=T)
    x_rl = pack_rows(x_bt, plan)          # [B, T] -> [R, L]
    x_bt = unpack_rows(x_rl, plan, T)     # [R, L] -> [B, T]

Per-session computations (advantages, value targets) stay in the [B, T]
layout; only the model's forward/backward runs on packed rows. Because each
sample keeps its own columns 0..n-1 and its targets were already shifted
inside its own row, a segment's last target is the pad id (mask 0), never
the next segment's first token.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


class RowPlan(NamedTuple):
  """Where the B samples of a one-per-row batch lie in R packed rows of length L.

  row_b / offset_b: packed row and first column of sample b (-1 / 0 for an
    empty sample, e.g. a padding row, which is not placed).
  length_b: tokens of sample b (its input side).
  src_row_rl / src_col_rl: for every packed slot, the sample and column it
    holds (-1 / 0 on padding).
  segment_ids_rl: 1, 2, ... for the samples of a row in column order; 0 on padding.
  """
  row_b: np.ndarray
  offset_b: np.ndarray
  length_b: np.ndarray
  src_row_rl: np.ndarray
  src_col_rl: np.ndarray
  segment_ids_rl: np.ndarray

  @property
  def shape(self) -> tuple[int, int]:
    return self.src_row_rl.shape

  @property
  def pad_fraction(self) -> float:
    r, l = self.shape
    return 1.0 - float(np.sum(self.length_b)) / max(r * l, 1)


def plan_rows(length_b: Sequence[int], row_len: int, *, row_multiple: int = 1,
              min_rows: int = 1) -> RowPlan:
  """First-fit decreasing: each sample, longest first, goes in the first row it fits.

  Rows are padded up to a multiple of `row_multiple` (minibatches x data
  shards) and at least `min_rows`. Ties in length keep the input order, so
  the plan is deterministic.
  """
  length_b = np.asarray(length_b, np.int64)
  if np.any(length_b > row_len):
    raise ValueError(f"a sample of {int(length_b.max())} tokens does not fit rows of {row_len}")
  if row_multiple < 1:
    raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
  b = len(length_b)
  row_b = np.full(b, -1, np.int32)
  offset_b = np.zeros(b, np.int32)
  used: list[int] = []  # tokens already placed in each row
  for i in np.argsort(-length_b, kind="stable"):
    n = int(length_b[i])
    if n == 0:
      continue
    for r, u in enumerate(used):
      if u + n <= row_len:
        break
    else:
      r = len(used)
      used.append(0)
    row_b[i], offset_b[i] = r, used[r]
    used[r] += n
  rows = max(len(used), int(min_rows), 1)
  rows = -(-rows // row_multiple) * row_multiple
  src_row = np.full((rows, row_len), -1, np.int32)
  src_col = np.zeros((rows, row_len), np.int32)
  for i in range(b):
    if row_b[i] < 0:
      continue
    r, o, n = row_b[i], offset_b[i], int(length_b[i])
    src_row[r, o:o + n] = i
    src_col[r, o:o + n] = np.arange(n)
  # Segment ids in column order within each row (1-based; 0 = padding).
  starts = (src_row >= 0) & (src_col == 0)
  seg = np.where(src_row >= 0, np.cumsum(starts, axis=1), 0).astype(np.int32)
  return RowPlan(row_b, offset_b, length_b.astype(np.int32), src_row, src_col, seg)


def pack_rows(x_bt, plan: RowPlan, fill=0) -> np.ndarray:
  """[B, T, ...] (one sample per row) -> [R, L, ...] packed; `fill` on padding slots."""
  x = np.asarray(x_bt)
  out = np.full(plan.shape + x.shape[2:], fill, x.dtype)
  real = plan.src_row_rl >= 0
  out[real] = x[plan.src_row_rl[real], plan.src_col_rl[real]]
  return out


def pack_per_sample(x_b, plan: RowPlan, fill=0) -> np.ndarray:
  """A per-sample value [B] spread over its tokens: [R, L]."""
  x = np.asarray(x_b)
  out = np.full(plan.shape, fill, x.dtype)
  real = plan.src_row_rl >= 0
  out[real] = x[plan.src_row_rl[real]]
  return out


def unpack_rows(x_rl, plan: RowPlan, t: int, fill=0) -> np.ndarray:
  """[R, L, ...] packed -> [B, t, ...] one sample per row; `fill` beyond each sample's length."""
  x = np.asarray(x_rl)
  out = np.full((len(plan.length_b), t) + x.shape[2:], fill, x.dtype)
  real = plan.src_row_rl >= 0
  out[plan.src_row_rl[real], plan.src_col_rl[real]] = x[real]
  return out
