"""Per-sequence aggregations count a packed segment as a sequence."""
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.credit.losses import PolicyLossConfig, policy_loss
from mtrl_jax.credit.ppo import aggregate


def _layouts(lengths, rows_of, seed):
  """The same sequences one per row [B, T] and packed [R, T] with segment ids."""
  r = np.random.default_rng(seed)
  t = 12
  b = len(lengths)
  loss = np.zeros((b, t), np.float32)
  mask = np.zeros((b, t), np.float32)
  for i, n in enumerate(lengths):
    loss[i, :n] = r.normal(size=n)
    mask[i, :n] = r.random(n) < 0.7
  n_rows = max(rows_of) + 1
  p_loss = np.zeros((n_rows, t), np.float32)
  p_mask = np.zeros((n_rows, t), np.float32)
  seg = np.zeros((n_rows, t), np.int32)
  used = [0] * n_rows
  for i, (n, row) in enumerate(zip(lengths, rows_of)):
    o = used[row]
    p_loss[row, o:o + n], p_mask[row, o:o + n] = loss[i, :n], mask[i, :n]
    seg[row, o:o + n] = seg[row].max() + 1
    used[row] += n
  return loss, mask, p_loss, p_mask, seg


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 10**6),
       st.sampled_from(["seq_mean_token_mean", "seq_mean_token_sum", "token_mean"]))
def test_packed_aggregate_equals_one_sequence_per_row(lengths, seed, mode):
  """Sequences of <= 4 tokens, three to a 12-token row.

  Catches: segments ignored (the packed row counted as one sequence: verified
  by passing segment_ids_bt=None to the packed call) and padding (segment 0)
  counted as a sequence.
  """
  rows_of = [i // 3 for i in range(len(lengths))]
  loss, mask, p_loss, p_mask, seg = _layouts(lengths, rows_of, seed)
  want = aggregate(jnp.asarray(loss), jnp.asarray(mask), mode, norm_len=7)
  got = aggregate(jnp.asarray(p_loss), jnp.asarray(p_mask), mode, norm_len=7, segment_ids_bt=jnp.asarray(seg))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_packed_segments_change_the_seq_mean():
  """A hand example: two sequences in one row, means 1 and 3 -> 2 (not the token mean 2.5)."""
  loss = jnp.array([[1.0, 3.0, 3.0, 3.0, 0.0]])
  mask = jnp.array([[1, 1, 1, 1, 0]])
  seg = jnp.array([[1, 2, 2, 2, 0]])
  assert float(aggregate(loss, mask, "seq_mean_token_mean", segment_ids_bt=seg)) == pytest.approx(2.0)
  assert float(aggregate(loss, mask, "seq_mean_token_mean")) == pytest.approx(2.5)


def test_policy_loss_per_token_success_and_segments():
  """policy_loss on a packed row equals it on the sessions one per row (NLL with per-token success)."""
  loss, mask, p_loss, p_mask, seg = _layouts([3, 4, 2], [0, 0, 0], seed=4)
  cfg = PolicyLossConfig(agg="seq_mean_token_mean", nll_coef=0.5, norm_len=12)
  success_b = np.array([1.0, 0.0, 1.0], np.float32)
  p_success = np.zeros_like(p_loss)
  p_success[0, :3], p_success[0, 7:9] = 1.0, 1.0
  z = np.zeros_like
  want, dw = policy_loss(cfg, jnp.asarray(loss), jnp.asarray(z(loss)), jnp.asarray(loss), jnp.asarray(mask),
                         success_b=jnp.asarray(success_b))
  got, dg = policy_loss(cfg, jnp.asarray(p_loss), jnp.asarray(z(p_loss)), jnp.asarray(p_loss),
                        jnp.asarray(p_mask), success_b=jnp.asarray(p_success), segment_ids_bt=jnp.asarray(seg))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(dg["nll"], dw["nll"], rtol=1e-6)
  assert abs(float(dw["nll"])) > 0.1
