"""Edges of the credit code that mutation testing found untested (docs/mutation.md).

Each test names, in its docstring, the break it catches; each was checked by
hand in a scratch copy: the test fails with the break in place and passes
without it. Expected values are worked out by hand (or with numpy) in the
comments. The equivalent survivors (a dtype cast that is a no-op, a fill that
is masked out later) have no test; the reasons are listed beside the run's
results.
"""
import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.credit import (aaw_sample, aggregate, collect_informative_groups,
                             informative_group_mask, make_credit_batch, shape_overlong,
                             value_loss)
from mtrl_jax.credit.ppo import clipped_surrogate


# ------------------------------------------------------------ packed aggregation
def test_segment_id_above_T_stays_in_its_own_row():
  """Catches dropping the upper clip of the segment ids (clip(seg, 0, None)): an id
  above T then lands on a segment of the next row."""
  # T = 2, so a row's flat ids are row * 3 + id. Row 0's id 4 is clipped to 2
  # (its own segment); unclipped it would be flat id 4 = row 1's segment 1.
  loss = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
  seg = np.array([[1, 4], [1, 1]], np.int32)
  got = aggregate(loss, np.ones((2, 2)), "seq_mean_token_mean", segment_ids_bt=seg)
  # segments: row 0 {1}, row 0 {2}, row 1 {10, 20}: (1 + 2 + 15) / 3 = 6
  # (merged: (1 + (2 + 10 + 20) / 3) / 2 = 5.83)
  np.testing.assert_allclose(got, 6.0, rtol=1e-6)


def test_one_token_segments_up_to_id_T_are_separate_sequences():
  """Catches a wrong row stride of the flat segment id ((t - 1) or (t + 2) instead of
  t + 1): ids run up to T, so a shorter stride merges row 0's last segment with row
  1's first, and a longer one pushes the last row's id T past the segment count."""
  # T = 2, every token its own sequence (ids 1 and 2 = T in both rows).
  loss = np.array([[1.0, 2.0], [10.0, 40.0]], np.float32)
  seg = np.array([[1, 2], [1, 2]], np.int32)
  got = aggregate(loss, np.ones((2, 2)), "seq_mean_token_mean", segment_ids_bt=seg)
  # four sequences: (1 + 2 + 10 + 40) / 4 = 13.25
  # (stride 1: {1}, {2, 10}, {40} -> 15.67; stride 4: 40 dropped -> 4.33)
  np.testing.assert_allclose(got, 13.25, rtol=1e-6)


def test_packed_aggregation_traces_abstractly():
  """Catches a segment count left to the data (num_segments=None, n = None): fine
  with jit off, an error under jit; eval_shape traces even with jit off."""
  loss = jnp.ones((2, 3))
  seg = jnp.array([[1, 1, 2], [1, 0, 0]], jnp.int32)
  for mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
    out = jax.eval_shape(lambda l, s, mode=mode: aggregate(l, l, mode, segment_ids_bt=s), loss, seg)
    assert out.shape == () and out.dtype == np.float32


# ------------------------------------------------------------------ dual clip
def test_dual_clip_flag_is_strict_at_ratio_c():
  """Catches the dual-clip flag counting ratio == c (>= instead of >): there the
  cap only ties the loss, and half the gradient still flows."""
  ratio = jnp.array([3.0, 3.5])
  adv, m = jnp.array([-1.0, -1.0]), jnp.array([True, True])
  loss, flags = clipped_surrogate(ratio, adv, m, 0.2, 0.28, dual_clip=3.0)
  np.testing.assert_allclose(loss, [3.0, 3.0])
  assert np.asarray(flags["dual_clip"]).tolist() == [False, True]
  grad = jax.grad(lambda r: clipped_surrogate(r, adv, m, 0.2, 0.28, 3.0)[0].sum())(ratio)
  np.testing.assert_allclose(grad, [0.5, 0.0])  # the tie keeps half the gradient


# ----------------------------------------------------------------- value loss
def test_value_loss_default_clip_is_0_2():
  """Catches another default clip_eps (0.2 -> 1.2)."""
  # V = 1, V_old = 0, target 2: err = 1; eps .2 clips V to .2: err_clip = 1.8^2 = 3.24,
  # loss = .5 * max(1, 3.24) = 1.62 (eps 1.2 would clip V to 1: loss .5).
  one = jnp.ones((1, 1))
  loss, diag = value_loss(one, 0 * one, 2 * one, one)
  np.testing.assert_allclose(loss, 1.62, rtol=1e-6)
  np.testing.assert_allclose(diag["value_clip_frac"], 1.0)


def test_value_loss_passes_norm_len_on():
  """Catches value_loss dropping norm_len (the seq_mean_token_sum divisor falling
  back to T)."""
  # One row, T = 4, two action tokens with errors 1 and 2 (no clipping):
  # per-token .5 * (1, 4) -> sum 2.5; / norm_len 2 = 1.25 (/ T = .625).
  v = jnp.array([[1.0, 2.0, 0.0, 0.0]])
  mask = jnp.array([[1.0, 1.0, 0.0, 0.0]])
  loss, _ = value_loss(v, v, jnp.zeros((1, 4)), mask, clip_eps=None,
                       agg="seq_mean_token_sum", norm_len=2)
  np.testing.assert_allclose(loss, 1.25, rtol=1e-6)


# ---------------------------------------------------------- make_credit_batch
def test_make_credit_batch_keeps_the_optional_fields_with_their_dtypes():
  """Catches make_credit_batch dropping state ids, turn rewards or progress shares
  (always None, or the argument left out) or not casting them (state ids to int32,
  turn rewards and progress to f32)."""
  state = np.array([[3.0, 7.0]])        # float ids: cast to int32
  turn_r = [[0, 1]]                     # ints: cast to f32
  progress = np.array([[0, 2]], np.int64)
  b = make_credit_batch(np.zeros((1, 2)), np.ones((1, 2)), state_id_bt=state,
                        turn_reward_bt=turn_r, progress_bt=progress)
  assert b.state_id_bt.dtype == np.int32 and b.state_id_bt.tolist() == [[3, 7]]
  assert b.turn_reward_bt.dtype == np.float32 and b.turn_reward_bt.tolist() == [[0.0, 1.0]]
  assert b.progress_bt.dtype == np.float32 and b.progress_bt.tolist() == [[0.0, 2.0]]
  plain = make_credit_batch(np.zeros((1, 2)), np.ones((1, 2)))
  assert plain.state_id_bt is None and plain.turn_reward_bt is None and plain.progress_bt is None


# ------------------------------------------------------------------- shaping
def test_collect_stops_at_groups_needed_in_a_later_round():
  """Catches the second round's quota counting up (groups_needed + kept instead of
  groups_needed - kept): it would then take every group of the round."""
  def draw(i):  # two informative groups per round, two rows each
    return {"group_id": np.array([5, 5, 6, 6]), "return": np.array([0.0, 1.0, 2.0, 0.0]),
            "row": np.arange(4) + 10 * i}
  out, stats = collect_informative_groups(draw, groups_needed=3, max_rounds=5)
  assert stats == {"rounds": 2, "dropped_groups": 0, "kept_groups": 3}
  assert out["group_id"].tolist() == [0, 0, 1, 1, 2, 2]
  assert out["row"].tolist() == [0, 1, 2, 3, 10, 11]


def test_informative_group_mask_traces_abstractly():
  """Catches the segment count left to the data (b = None: num_segments=None),
  an error under jit only; eval_shape traces even with jit off."""
  batch = make_credit_batch(np.zeros((3, 2)), np.ones((3, 2)), group_id_b=np.array([0, 0, 1]),
                            return_b=np.array([0.0, 1.0, 1.0]))
  out = jax.eval_shape(informative_group_mask, batch)
  assert out.shape == (3,) and out.dtype == np.bool_
  assert np.asarray(informative_group_mask(batch)).tolist() == [True, True, False]


def test_episode_overlong_length_is_per_episode():
  """Catches the default episode length summed over the whole batch (sum over
  axis None instead of axis 1): every episode would be charged for all tokens."""
  # Two one-row episodes, T = 4: 3 and 1 action tokens. max_len 4, buffer 2:
  # free up to 2 tokens, then -1/2 per token: -0.5 and 0 (the batch total, 4, gives -1 each).
  mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
  batch = make_credit_batch(np.zeros((2, 4)), mask)
  out = jax.jit(lambda b: shape_overlong(b, max_len=4, buffer_len=2, per="episode"))(batch)
  np.testing.assert_allclose(out.reward_bt, [[0, 0, -0.5, 0], [0, 0, 0, 0]], atol=1e-6)
  np.testing.assert_allclose(out.return_b, [-0.5, 0.0], atol=1e-6)


# ----------------------------------------------------------------------- AAW
def _one_group(returns):
  n = len(returns)
  return make_credit_batch(np.zeros((n, 1)), np.ones((n, 1)), group_id_b=np.zeros(n),
                           return_b=np.asarray(returns, np.float32))


def test_aaw_sample_uses_its_floor():
  """Catches aaw_sample not passing `floor` on to the probabilities (floor 0 then)."""
  # Returns 0, 0, 1, 3 (mean 1): |A| = 1, 1, 0, 2 unscaled; + floor 1 -> 2, 2, 1, 3 over 8.
  batch = _one_group([0.0, 0.0, 1.0, 3.0])
  sample = jax.jit(lambda k, b: aaw_sample(k, b, 1, floor=1.0, scale_by_std=False))
  _, _, _, probs = sample(jax.random.key(0), batch)
  np.testing.assert_allclose(probs, [0.25, 0.25, 0.125, 0.375], rtol=1e-5)


def test_aaw_draws_follow_the_probabilities_with_many_episodes():
  """Catches Gumbel noise subtracted instead of added (logits - G): with two slots the
  draw is unchanged (the difference of two Gumbels is symmetric), with eight the
  favourite is drawn 70% of the time instead of 50%."""
  # Returns 8, 0 x 7 (mean 1): |A| proportional to 7, 1 x 7 -> p = .5, 1/14 x 7.
  batch = _one_group([8.0] + [0.0] * 7)
  keys = jax.random.split(jax.random.key(3), 2000)
  _, slots, _, probs = jax.jit(jax.vmap(lambda k: aaw_sample(k, batch, 1)))(keys)
  want = np.array([0.5] + [1 / 14] * 7)
  np.testing.assert_allclose(probs[0], want, rtol=1e-5)
  freq = np.bincount(np.asarray(slots)[:, 0], minlength=8) / 2000
  np.testing.assert_allclose(freq, want, atol=0.05)  # sd ~.011 at p=.5; the break gives ~.70
