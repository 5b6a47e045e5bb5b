"""segments.py, the bookkeeping every estimator stands on, against plain
numpy references on random inputs (ids with repeats and gaps, empty rows,
turn indices out of range, several shapes).

Breaks checked to fail here (the mutants, run against this file with jit
off): segment_normalize with `+ eps` turned into `- eps` (both normalize
tests) and `cnt - ddof` into `cnt + ddof` (the numpy comparison);
reverse_cumcount returning floats. Meant to catch as well (not run one by
one): dense_rank comparing the wrong neighbours; a default eps / ddof /
scale_by_std changed; episode_table's first row or validity wrong;
turn_table counting turns >= K or non-action tokens, or swapping first/last.
"""
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.credit.segments import (dense_rank, episode_table, gather_turns,
                                      per_episode, reverse_cumcount, segment_normalize,
                                      turn_table)

seeds = st.integers(0, 2**31 - 1)
SIZES = st.sampled_from([1, 2, 5, 9])  # few shapes: each compiles once


@settings(max_examples=30, deadline=None)
@given(seed=seeds, n=SIZES)
def test_dense_rank_matches_numpy_unique(seed, n):
  """Ranks are the index of each id among the sorted distinct ids."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(-3, 4, size=n) * int(rng.integers(1, 1000))  # repeats, negatives, gaps
  _, expect = np.unique(ids, return_inverse=True)
  got = np.asarray(dense_rank(jnp.asarray(ids, jnp.int32)))
  np.testing.assert_array_equal(got, expect.reshape(-1))
  assert got.dtype == np.int32


def _normalize_ref(x, seg, valid, n, eps, scale, ddof):
  x = x.astype(np.float64)
  out = np.zeros_like(x)
  for s in range(n):
    idx = np.flatnonzero(valid & (seg == s))
    if idx.size == 0:
      continue
    dev = x[idx] - x[idx].mean()
    if scale:
      var = (dev ** 2).sum() / max(idx.size - ddof, 1)
      sd = np.sqrt(var) + eps
      dev = dev / sd if sd > 0 else np.zeros_like(dev)
    out[idx] = dev
  return out


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.sampled_from([6, 17]), eps=st.sampled_from([0.0, 1e-6, 0.5]),
       ddof=st.sampled_from([0, 1]), scale=st.booleans())
def test_segment_normalize_matches_numpy(seed, n, eps, ddof, scale):
  """(x - mean) / (std + eps) per segment over valid entries, invalid -> 0.
  Values have a large common offset (1e3) so a missing shift or a shift
  applied twice shows up; eps 0.5 makes `+ eps` vs `- eps` a large effect."""
  rng = np.random.default_rng(seed)
  k = int(rng.integers(1, 4))
  seg = rng.integers(0, k, size=n).astype(np.int32)
  valid = rng.random(n) < 0.75
  x = (1e3 + rng.normal(size=n) * rng.choice([0.3, 3.0])).astype(np.float32)
  x[~valid] = rng.normal(size=(~valid).sum()) * 1e6  # must not matter
  got = np.asarray(segment_normalize(jnp.asarray(x), jnp.asarray(seg), jnp.asarray(valid),
                                     k, eps, scale, ddof))
  expect = _normalize_ref(x, seg, valid, k, eps, scale, ddof)
  np.testing.assert_allclose(got, expect, rtol=2e-3, atol=2e-3)
  assert np.all(got[~valid] == 0.0)


def test_segment_normalize_defaults_are_population_std_and_small_eps():
  """Defaults: eps 1e-6, scale_by_std True, ddof 0. Segment 0 holds 3, 1
  (mean 2, population std 1 -> +-1/(1 + 1e-6)); segment 1 holds 5 alone
  (deviation 0); the invalid entry is 0."""
  x = jnp.asarray([3.0, 1.0, 5.0, 7.0])
  seg = jnp.asarray([0, 0, 1, 0])
  valid = jnp.asarray([True, True, True, False])
  got = np.asarray(segment_normalize(x, seg, valid, 2))
  np.testing.assert_allclose(got, [1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0, 0.0], rtol=1e-7)
  assert got[0] != 1.0  # eps is there (1/(1+1e-6) rounds below 1 in float32)


def _random_rows(rng, b, t, k):
  mask = (rng.random((b, t)) < 0.5).astype(np.float32)
  mask[rng.random(b) < 0.3] = 0.0  # rows without any action token
  turn = rng.integers(-1, k + 2, size=(b, t)).astype(np.int32)  # some out of [0, K)
  reward = rng.normal(size=(b, t)).astype(np.float32)
  ep_ids = rng.integers(0, max(b // 2, 1), size=b) * 10 + 4
  return reward, mask, turn, ep_ids


@settings(max_examples=30, deadline=None)
@given(seed=seeds, b=st.sampled_from([1, 4, 7]))
def test_episode_table_matches_numpy(seed, b):
  """Slot e holds the e-th smallest episode id; first_e its lowest row;
  valid_e: some row of it has an action token; empty slots: first 0, invalid."""
  rng = np.random.default_rng(seed)
  _, mask, _, ep_ids = _random_rows(rng, b, 5, 3)
  tab = episode_table(jnp.asarray(ep_ids, jnp.int32), jnp.asarray(mask))
  uniq, inv = np.unique(ep_ids, return_inverse=True)
  np.testing.assert_array_equal(np.asarray(tab.ep_b), inv.reshape(-1))
  first = np.zeros(b, np.int64)
  valid = np.zeros(b, bool)
  for e, u in enumerate(uniq):
    rows = np.flatnonzero(ep_ids == u)
    first[e] = rows.min()
    valid[e] = mask[rows].sum() > 0
  np.testing.assert_array_equal(np.asarray(tab.first_e), first)
  np.testing.assert_array_equal(np.asarray(tab.valid_e), valid)
  x = rng.normal(size=b).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(per_episode(jnp.asarray(x), tab)), x[first])


@settings(max_examples=30, deadline=None)
@given(seed=seeds, b=st.sampled_from([1, 3, 6]), k=st.sampled_from([1, 3]))
def test_turn_table_matches_numpy(seed, b, k):
  """Per (episode slot, turn < K): summed action-token reward, token count,
  existence, flat index of the first / last action token; each action token's
  segment id, B*K for tokens that are not counted; gather_turns broadcasts a
  per-turn value back (0 elsewhere)."""
  t = 6
  rng = np.random.default_rng(seed)
  reward, mask, turn, ep_ids = _random_rows(rng, b, t, k)
  ep_b = np.asarray(dense_rank(jnp.asarray(ep_ids, jnp.int32)))
  tt = turn_table(jnp.asarray(reward), jnp.asarray(mask), jnp.asarray(turn),
                  jnp.asarray(ep_b), k)
  counted = (mask > 0) & (turn >= 0) & (turn < k)
  r = np.zeros((b, k)); c = np.zeros((b, k), np.int64)
  first = np.full((b, k), b * t - 1); last = np.zeros((b, k), np.int64)
  seg = np.full((b, t), b * k)
  for i in range(b):
    for j in range(t):
      if counted[i, j]:
        e, kk = ep_b[i], turn[i, j]
        seg[i, j] = e * k + kk
        if c[e, kk] == 0:
          first[e, kk] = i * t + j
        first[e, kk] = min(first[e, kk], i * t + j)
        last[e, kk] = max(last[e, kk], i * t + j)
        r[e, kk] += reward[i, j]
        c[e, kk] += 1
  exists = c > 0
  np.testing.assert_allclose(np.asarray(tt.reward_ek), r, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(tt.count_ek), c)
  np.testing.assert_array_equal(np.asarray(tt.exists_ek), exists)
  np.testing.assert_array_equal(np.asarray(tt.seg_bt), seg)
  np.testing.assert_array_equal(np.asarray(tt.first_ek)[exists], first[exists])
  np.testing.assert_array_equal(np.asarray(tt.last_ek)[exists], last[exists])
  # Where a turn does not exist the indices are clipped into range.
  assert np.all((np.asarray(tt.first_ek) >= 0) & (np.asarray(tt.first_ek) < b * t))
  assert np.all((np.asarray(tt.last_ek) >= 0) & (np.asarray(tt.last_ek) < b * t))
  val_ek = rng.normal(size=(b, k)).astype(np.float32)
  got = np.asarray(gather_turns(jnp.asarray(val_ek), tt))
  expect = np.where(counted, val_ek.reshape(-1)[np.minimum(seg, b * k - 1)], 0.0)
  np.testing.assert_array_equal(got, expect.astype(np.float32))


@settings(max_examples=20, deadline=None)
@given(seed=seeds, t=st.sampled_from([1, 4, 9]))
def test_reverse_cumcount_counts_later_mask_tokens(seed, t):
  rng = np.random.default_rng(seed)
  m = rng.random((3, t)) < 0.5
  expect = np.array([[m[i, j + 1:].sum() for j in range(t)] for i in range(3)])
  for mask in (m, m.astype(np.float32)):  # bool or float loss masks
    got = reverse_cumcount(jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(got), expect)
    assert got.dtype == np.int32  # a count (used as an exponent of gamma*lambda)


def test_turn_table_hand_example_with_a_turn_on_the_very_last_token():
  """Two rows of one-token turns; episode 1's turn 1 is the batch's very last
  token (flat index b*t - 1 = 5), so its first and last index must come out
  as 5, not clipped to 4. Counts are int32 (a token count), and gather_turns
  keeps the dtype of what it spreads (it also spreads int32 indices).

  Catches (mutants seen surviving the random test at 5 examples): clipping
  first/last to b*t - 2; count_ek as float (astype(None)); gather_turns'
  zero pad as float32 for int32 input."""
  #   row 0: mask 1 0 1, turn 0 0 1  -> (ep 0, turn 0) = flat 0, (ep 0, turn 1) = flat 2
  #   row 1: mask 0 1 1, turn 0 0 1  -> (ep 1, turn 0) = flat 4, (ep 1, turn 1) = flat 5
  mask = jnp.asarray([[1, 0, 1], [0, 1, 1]], jnp.float32)
  turn = jnp.asarray([[0, 0, 1], [0, 0, 1]], jnp.int32)
  reward = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.float32)
  tt = turn_table(reward, mask, turn, jnp.asarray([0, 1], jnp.int32), 2)
  np.testing.assert_array_equal(np.asarray(tt.first_ek), [[0, 2], [4, 5]])
  np.testing.assert_array_equal(np.asarray(tt.last_ek), [[0, 2], [4, 5]])
  np.testing.assert_array_equal(np.asarray(tt.reward_ek), [[1, 3], [5, 6]])
  np.testing.assert_array_equal(np.asarray(tt.count_ek), [[1, 1], [1, 1]])
  np.testing.assert_array_equal(np.asarray(tt.seg_bt), [[0, 4, 1], [4, 2, 3]])
  assert tt.count_ek.dtype == np.int32
  spread = gather_turns(jnp.asarray([[10, 11], [12, 13]], jnp.int32), tt)
  np.testing.assert_array_equal(np.asarray(spread), [[10, 0, 11], [0, 12, 13]])
  assert spread.dtype == np.int32
