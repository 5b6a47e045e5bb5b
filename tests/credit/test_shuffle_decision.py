"""credit/shuffle.py's graded control: a fraction of the sessions' decision-turn credit handed to others.

Every test builds rows whose decision advantages are distinct, so the output names each row's donor.
Each docstring names the break it was checked against (in a scratch copy of shuffle.py).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtrl_jax.credit.shuffle import shuffle_decision_advantages

_shuffle = jax.jit(shuffle_decision_advantages)  # `fraction` traced: one compile per shape
B, T = 6, 8


def _batch(rng, b=B, t=T, pad_rows=1):
  """[B, T] advantages, masks and turn ids: each real row a session (turn 0 then turns 1-2, an
  observation token with mask 0 before each turn's actions), the last `pad_rows` rows padding."""
  turn = np.zeros((b, t), np.int32)
  mask = np.zeros((b, t), np.float32)
  for r in range(b - pad_rows):
    n0 = int(rng.integers(1, 3))  # 1-2 decision tokens, then the rest of the row on turns 1, 2
    turn[r, 1 + n0:] = np.minimum(1 + np.arange(t - 1 - n0) // 2, 2)
    mask[r, 1:1 + n0] = 1.0
    mask[r, 1 + n0:] = rng.random(t - 1 - n0) < 0.7
  adv = rng.standard_normal((b, t)).astype(np.float32)
  for r in range(b):  # a constant, distinct decision advantage per row (the outcome estimators')
    adv[r, (turn[r] == 0) & (mask[r] > 0)] = 10.0 * (r + 1)
  return adv, mask, turn


def _decision(adv, mask, turn):
  """Each row's decision advantage (mean over its turn-0 action tokens; nan without any)."""
  dec = (mask > 0) & (turn == 0)
  return np.array([adv[r, dec[r]].mean() if dec[r].any() else np.nan for r in range(adv.shape[0])])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.2, 0.25, 0.5, 0.6, 1.0]))
def test_only_drawn_rows_decision_tokens_change_and_the_decision_multiset_stays(seed, q):
  """Tokens off turn 0, masked-out tokens (observations, padding rows) and undrawn rows are
  untouched bit for bit; the rows' decision advantages are the same multiset; exactly round(q x n)
  rows take another row's value (a random cycle: none keeps its own when 2 or more are drawn); a
  drawn row's decision tokens all carry its donor's value.

  Breaks checked: the mask ignored (observation tokens of turn 0 rewritten) fails 'untouched';
  `turn_idx == decision_turn` dropped (every action token shuffled) fails 'off turn 0'; k from
  the row count B instead of the rows with decision tokens (the cycle then reaches the padding
  row and hands out its 0) fails the multiset; a plain permutation instead of the cycle (fixed points) fails
  'exactly round(q x n) change'."""
  rng = np.random.default_rng(seed)
  adv, mask, turn = _batch(rng)
  out = np.asarray(_shuffle(jnp.asarray(adv), jnp.asarray(mask), jnp.asarray(turn), jax.random.key(seed), q))
  dec = (mask > 0) & (turn == 0)
  np.testing.assert_array_equal(out[~dec], adv[~dec])  # off turn 0, masked, padding: untouched
  before, after = _decision(adv, mask, turn), _decision(out, mask, turn)
  has = ~np.isnan(before)
  np.testing.assert_array_equal(np.sort(after[has]), np.sort(before[has]))
  n = int(has.sum())
  k = int(np.floor(q * n + 0.5))
  changed = has & (after != before)
  assert changed.sum() == (k if k >= 2 else 0)
  for r in np.nonzero(changed)[0]:  # one donor's value on every decision token of the row
    assert np.all(out[r, dec[r]] == after[r])


def test_every_row_is_drawn_about_q_of_the_time_and_donors_are_uniform():
  """Over 2000 keys at q = 0.5 with 4 sessions (2 drawn, so they swap): each row changes in
  0.5 +- 0.05 of the draws, and each of the 6 pairs swaps 1/6 +- 0.03 of the time.

  Breaks checked: a fixed key (the same rows every update) fails the shares; drawing the first k
  rows by index instead of a random rank fails 'each row about half the time'."""
  adv = np.zeros((5, 3), np.float32)
  adv[:4, 0] = [1.0, 2.0, 3.0, 4.0]
  mask = np.zeros((5, 3), np.float32)
  mask[:4, 0] = 1.0
  turn = np.zeros((5, 3), np.int32)
  keys = jax.random.split(jax.random.key(7), 2000)
  out = np.asarray(jax.vmap(lambda k: shuffle_decision_advantages(
      jnp.asarray(adv), jnp.asarray(mask), jnp.asarray(turn), k, 0.5))(keys))[:, :4, 0]
  moved = out != adv[None, :4, 0]
  assert np.all(moved.sum(1) == 2)
  np.testing.assert_allclose(moved.mean(0), 0.5, atol=0.05)
  pairs = {}
  for row in moved:
    pairs[tuple(np.nonzero(row)[0])] = pairs.get(tuple(np.nonzero(row)[0]), 0) + 1
  assert len(pairs) == 6 and all(abs(v / 2000 - 1 / 6) < 0.03 for v in pairs.values()), pairs


def test_the_turn_layout_touches_only_the_rows_that_train_turn_0():
  """One row per turn (MS-GRPO's turn layout with history: earlier turns in front with mask 0):
  only the turn-0 rows' actions swap; a history row's earlier turn-0 tokens (mask 0) and the
  turn-1 rows keep theirs. Break checked: the decision read from turn ids alone (mask ignored)
  rewrites the history rows' turn-0 context tokens."""
  # rows 0-2: turn 0 of sessions a, b, c; rows 3-5: their turn 1 with turn 0 as context (mask 0 there)
  adv = np.array([[1, 1, 0, 0], [2, 2, 0, 0], [3, 3, 0, 0], [7, 7, 4, 4], [8, 8, 5, 5], [9, 9, 6, 6]], np.float32)
  mask = np.array([[1, 1, 0, 0]] * 3 + [[0, 0, 1, 1]] * 3, np.float32)
  turn = np.array([[0, 0, 0, 0]] * 3 + [[0, 0, 1, 1]] * 3, np.int32)
  out = np.asarray(_shuffle(jnp.asarray(adv), jnp.asarray(mask), jnp.asarray(turn), jax.random.key(0), 1.0))
  np.testing.assert_array_equal(out[3:], adv[3:])
  assert sorted(out[:3, 0]) == [1, 2, 3] and all(out[r, 0] != adv[r, 0] for r in range(3))


def test_bad_inputs_name_themselves():
  z = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match="differ in shape"):
    shuffle_decision_advantages(z, z, jnp.zeros((3, 2), jnp.int32), jax.random.key(0))
  with pytest.raises(ValueError, match="fraction=0"):
    shuffle_decision_advantages(z, z, jnp.zeros((2, 3), jnp.int32), jax.random.key(0), 0.0)
