"""Overlong shaping and dynamic sampling against a plain-loop numpy reference,
in the session and the per-turn layouts, plus the host loop's bookkeeping.

Found by mutation testing (docs/mutation.md): shaping only had one hand
example per mode (one episode each, every turn inside max_turns), and the
host loop was never run with a tolerance, episode ids, a flat first round or
a cut inside a round. Breaks checked by hand in a scratch copy: the episode
penalty's turn fill -1 -> +1 (a one-turn episode's penalty lands on a turn
that does not exist), `dropped += n_drop` -> `dropped = n_drop`,
`take = dense < n_new` -> `<=`, and `continue` -> `break` after a flat round.
"""
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_fixtures import random_sessions, split_per_turn, to_batch
from mtrl_jax.credit import (collect_informative_groups, informative_group_mask, informative_groups_np,
                             make_credit_batch, overlong_penalty, shape_overlong)


def penalty(length, max_len, buffer_len, factor):
  return min(max(-(length - (max_len - buffer_len)) / buffer_len * factor, -abs(factor)), 0.0)


def shape_reference(d, max_len, buffer_len, factor, per, length_b, max_turns):
  """shape_overlong with loops: per (episode, turn) counts, the penalty on the last token."""
  reward = d["reward_bt"].astype(np.float64).copy()
  ret = d["return_b"].astype(np.float64).copy()
  b, t = reward.shape
  k = t if max_turns is None else max_turns
  for e in np.unique(d["episode_id_b"]):
    rows = [i for i in range(b) if d["episode_id_b"][i] == e]
    turns = {}
    for i in rows:
      for c in range(t):
        j = d["turn_idx_bt"][i, c]
        if d["loss_mask_bt"][i, c] > 0 and 0 <= j < k:
          turns.setdefault(int(j), []).append(i * t + c)
    total = 0.0
    if per == "turn":
      for j, pos in turns.items():
        p = penalty(len(pos), max_len, buffer_len, factor)
        reward.reshape(-1)[max(pos)] += p
        total += p
    elif turns:  # an episode whose action tokens all lie past max_turns gets nothing
      n = length_b[rows[0]] if length_b is not None else sum(len(p) for p in turns.values())
      p = penalty(n, max_len, buffer_len, factor)
      reward.reshape(-1)[max(turns[max(turns)])] += p
      total = p
    ret[rows] += total
  return reward, ret


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), per=st.sampled_from(["turn", "episode"]),
       per_turn_layout=st.booleans(), max_turns=st.sampled_from([None, 1, 2]),
       budget=st.sampled_from([(3, 2, 1.0), (6, 4, 2.5), (2, 1, 0.5)]), given_length=st.booleans())
def test_shape_overlong_matches_the_reference(seed, per, per_turn_layout, max_turns, budget,
                                              given_length):
  d = random_sessions(seed, b=4, t=8, pad_row=seed % 2 == 0)
  if per_turn_layout:
    d, _ = split_per_turn(d, seed, pad_rows_to=10)
  max_len, buffer_len, factor = budget
  length_b = None
  if given_length:  # the same value on every row of an episode
    length_b = (d["episode_id_b"] * 7 % 9).astype(np.int32)
  out = shape_overlong(to_batch(d), max_len=max_len, buffer_len=buffer_len, factor=factor, per=per,
                       length_b=length_b, max_turns=max_turns)
  want_r, want_ret = shape_reference(d, max_len, buffer_len, factor, per, length_b, max_turns)
  np.testing.assert_allclose(out.reward_bt, want_r, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.return_b, want_ret, rtol=1e-6, atol=1e-6)


def test_episode_penalty_of_a_one_turn_episode_hand_example():
  """One turn of 3 tokens (context cap 4, buffer 2: -(3 - 2) / 2 = -.5) on its last token."""
  batch = make_credit_batch(np.zeros((1, 4)), np.array([[0, 1, 1, 1]]))
  out = shape_overlong(batch, max_len=4, buffer_len=2, per="episode")
  np.testing.assert_allclose(out.reward_bt, [[0, 0, 0, -0.5]])
  np.testing.assert_allclose(out.return_b, [-0.5])


def test_shaping_options_are_checked():
  batch = make_credit_batch(np.zeros((1, 2)), np.ones((1, 2)))
  with pytest.raises(ValueError, match=r"^per must be one of \('turn', 'episode'\), got 'session'$"):
    shape_overlong(batch, max_len=4, buffer_len=2, per="session")
  for buf in (0, 5):
    with pytest.raises(ValueError, match=rf"^need 0 < buffer_len <= max_len, got {buf}, 4$"):
      overlong_penalty(3, 4, buf)
  np.testing.assert_allclose(overlong_penalty(np.array([0, 2, 3, 4]), 4, 4), [0, -0.5, -0.75, -1])


def informative_reference(d, tol, only_valid=True):
  """Rows of groups whose episodes' returns (first row each) span more than tol.

  only_valid: count only episodes with an action token (the jit version reads
  the loss mask; the host helper gets no mask and counts every episode).
  """
  b = len(d["group_id_b"])
  first = {}
  valid = set()
  for i in range(b):
    e = d["episode_id_b"][i]
    first.setdefault(e, i)
    if d["loss_mask_bt"][i].any() or not only_valid:
      valid.add(e)
  span = {}
  for e, i in first.items():
    if e in valid:
      g = d["group_id_b"][i]
      lo, hi = span.get(g, (np.inf, -np.inf))
      span[g] = (min(lo, d["return_b"][i]), max(hi, d["return_b"][i]))
  good = {g for g, (lo, hi) in span.items() if hi - lo > tol}
  return np.array([d["group_id_b"][i] in good for i in range(b)])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tol=st.sampled_from([0.0, 0.5, 1.0]), per_turn_layout=st.booleans())
def test_informative_groups_match_the_reference(seed, tol, per_turn_layout):
  d = random_sessions(seed, b=6, t=6, n_groups=3, pad_row=True)
  r = np.random.default_rng(seed)
  d["return_b"] = r.integers(0, 3, size=6).astype(np.float32) * 0.5  # spans 0, .5, 1: on the tolerances
  if per_turn_layout:
    d, _ = split_per_turn(d, seed, pad_rows_to=12)
  want = informative_reference(d, tol)
  got = jax.jit(informative_group_mask, static_argnums=1)(to_batch(d), tol)
  assert np.asarray(got).tolist() == want.tolist()
  want_host = informative_reference(d, tol, only_valid=False)
  keep, dropped = informative_groups_np(d["group_id_b"], d["return_b"], d["episode_id_b"], tol)
  assert keep.tolist() == want_host.tolist()
  groups = set(d["group_id_b"].tolist())
  assert dropped == len(groups) - len(set(d["group_id_b"][want_host].tolist()))


def test_host_helper_reads_one_row_per_episode_and_honours_tol():
  # Episode 5 spans rows 0 and 1 with (unread) return 9 on row 1: group 0 = episodes 5, 6 -> 1, 1.
  keep, dropped = informative_groups_np([0, 0, 0, 1, 1], [1, 9, 1, 0, 0.5], [5, 5, 6, 7, 8])
  assert keep.tolist() == [False, False, False, True, True] and dropped == 1
  keep, dropped = informative_groups_np([0, 0, 0, 1, 1], [1, 9, 1, 0, 0.5])  # every row counts
  assert keep.tolist() == [True] * 5 and dropped == 0
  keep, dropped = informative_groups_np([0, 0, 1, 1], [0, 1, 0, 0.5], tol=0.5)
  assert keep.tolist() == [True, True, False, False] and dropped == 1
  keep, dropped = informative_groups_np([3, 3], [-2.0, -1.0])  # negative returns
  assert keep.tolist() == [True, True] and dropped == 0


def test_collect_loop_bookkeeping_hand_example():
  """Round 0 is all flat; round 1 has three useful groups of which two are needed."""
  seen = []

  def draw(i):
    seen.append(i)
    if i == 0:
      return {"group_id": np.array([4, 4, 9, 9]), "return": np.array([1.0, 1.0, 2.0, 2.0]),
              "tag": np.array([0, 1, 2, 3])}
    return {"group_id": np.array([7, 7, 2, 2, 5, 5, 8, 8]),
            "return": np.array([0.0, 1.0, 3.0, 3.0, 0.0, 0.4, 1.0, 0.0]),
            "tag": np.array([10, 11, 12, 13, 14, 15, 16, 17])}

  out, stats = collect_informative_groups(draw, groups_needed=2, max_rounds=5)
  assert seen == [0, 1]
  # useful groups of round 1 by id: 5 (dense 0), 7 (dense 1), 8 (dense 2); the first two are taken
  assert out["tag"].tolist() == [10, 11, 14, 15]
  assert out["group_id"].tolist() == [1, 1, 0, 0]
  assert stats == {"rounds": 2, "dropped_groups": 3, "kept_groups": 2}
  # With tol .5, group 5 (span .4) is flat too.
  seen.clear()
  out, stats = collect_informative_groups(draw, groups_needed=5, max_rounds=2, tol=0.5)
  assert stats == {"rounds": 2, "dropped_groups": 4, "kept_groups": 2}
  assert out["tag"].tolist() == [10, 11, 16, 17] and out["group_id"].tolist() == [0, 0, 1, 1]


def test_collect_loop_relabels_after_earlier_rounds_and_reads_episode_ids():
  rounds = [
      {"group_id": np.array([1, 1]), "return": np.array([0.0, 1.0]), "episode_id": np.array([0, 1])},
      # episode 3 spans two rows; only its first row's return (1.0) is read: group 1 is flat
      {"group_id": np.array([1, 1, 1, 6, 6]), "return": np.array([1.0, 1.0, 0.0, 0.0, 2.0]),
       "episode_id": np.array([2, 3, 3, 4, 5])},
  ]
  out, stats = collect_informative_groups(lambda i: rounds[i], groups_needed=3, max_rounds=2)
  assert out["group_id"].tolist() == [0, 0, 1, 1]  # round 1's group 6 follows round 0's group
  assert out["episode_id"].tolist() == [0, 1, 4, 5]
  assert stats == {"rounds": 2, "dropped_groups": 1, "kept_groups": 2}
  out, stats = collect_informative_groups(lambda i: rounds[0] | {"return": np.zeros(2)}, 1, 3)
  assert out == {} and stats == {"rounds": 3, "dropped_groups": 3, "kept_groups": 0}


@pytest.mark.parametrize("per", ["turn", "episode"])
def test_shaped_batch_stays_float32_with_x64_on(per):
  """Rewards and returns keep their float32 dtype under jax_enable_x64 (the learner's buffers)."""
  batch = make_credit_batch(np.zeros((2, 4)), np.array([[0, 1, 1, 1], [1, 1, 0, 0]]))
  jax.config.update("jax_enable_x64", True)
  try:
    out = shape_overlong(batch, max_len=4, buffer_len=2, per=per, length_b=np.array([5, 3]))
    assert out.reward_bt.dtype == np.float32 and out.return_b.dtype == np.float32
    assert overlong_penalty(np.array([3]), 4, 2).dtype == np.float32
  finally:
    jax.config.update("jax_enable_x64", False)


def test_informative_group_mask_traces_abstractly():
  """Its segment counts are static (B), so it runs under jit whatever the ids hold."""
  batch = make_credit_batch(np.zeros((4, 2)), np.ones((4, 2)), group_id_b=np.array([0, 0, 5, 5]),
                            return_b=np.array([0.0, 1.0, 2.0, 2.0]))
  out = jax.eval_shape(informative_group_mask, batch)
  assert out.shape == (4,) and out.dtype == np.bool_
