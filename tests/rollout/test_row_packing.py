"""Several samples per row: first-fit-decreasing plan, and per-token arrays packed and unpacked exactly."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.rollout.row_packing import pack_per_sample, pack_rows, plan_rows, unpack_rows


def test_first_fit_decreasing_hand_example():
  """Lengths 5, 3, 4, 0, 2 into rows of 8: 5 then 3 in row 0, 4 then 2 in row 1; padded to 4 rows."""
  plan = plan_rows([5, 3, 4, 0, 2], 8, row_multiple=4)
  assert plan.shape == (4, 8)
  assert plan.row_b.tolist() == [0, 0, 1, -1, 1]
  assert plan.offset_b.tolist() == [0, 5, 0, 0, 4]
  assert plan.segment_ids_rl[0].tolist() == [1] * 5 + [2] * 3
  assert plan.segment_ids_rl[1].tolist() == [1] * 4 + [2] * 2 + [0] * 2
  assert not plan.segment_ids_rl[2:].any()
  assert plan.pad_fraction == pytest.approx(1 - 14 / 32)
  x = np.arange(5 * 8).reshape(5, 8) + 100
  packed = pack_rows(x, plan, fill=-1)
  assert packed[0].tolist() == [100, 101, 102, 103, 104, 108, 109, 110]
  assert packed[1].tolist() == [116, 117, 118, 119, 132, 133, -1, -1]
  assert pack_per_sample(np.array([7, 8, 9, 10, 11]), plan)[1].tolist() == [9] * 4 + [11] * 2 + [0] * 2


def test_too_long_a_sample_is_refused():
  with pytest.raises(ValueError, match="does not fit"):
    plan_rows([9], 8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 16), min_size=1, max_size=20), st.integers(1, 4))
def test_pack_then_unpack_is_the_identity_on_real_tokens(lengths, multiple):
  """Every real token lands in exactly one packed slot and comes back to its own place.

  Catches: overlapping placements, rows over-filled, segment ids that do not
  restart per row or are not contiguous, unpack writing beyond a sample's
  length (verified by packing from src_col + 1).
  """
  t = 16
  plan = plan_rows(lengths, t, row_multiple=multiple)
  r, l = plan.shape
  assert l == t and r % multiple == 0
  x = np.random.default_rng(len(lengths)).integers(1, 1000, (len(lengths), t, 2))
  back = unpack_rows(pack_rows(x, plan), plan, t, fill=0)
  for i, n in enumerate(lengths):
    np.testing.assert_array_equal(back[i, :n], x[i, :n])
    assert not back[i, n:].any()
  assert np.sum(plan.src_row_rl >= 0) == sum(lengths)
  for row in range(r):
    seg = plan.segment_ids_rl[row]
    used = seg > 0
    # Real tokens first, then padding; ids 1, 2, ... in contiguous runs.
    assert not np.any(used[1:] & ~used[:-1])
    ids = seg[used]
    assert np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1) and (ids.size == 0 or ids[0] == 1)
    # Each segment's columns count 0, 1, ...: these are its positions.
    for s in np.unique(ids):
      np.testing.assert_array_equal(plan.src_col_rl[row][seg == s], np.arange(np.sum(seg == s)))
  # First fit decreasing never leaves two rows that could have been one.
  fill = np.sum(plan.segment_ids_rl > 0, axis=1)
  real_rows = fill[fill > 0]
  assert all(a + b > t for i, a in enumerate(real_rows) for b in real_rows[i + 1:])
