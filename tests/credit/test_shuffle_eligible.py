"""credit/shuffle.py's graded control drawn among eligible rows only (sessions whose decision reply was valid).

Random shapes, padding rows, masks, turn ids and eligibility masks (hypothesis). Each docstring names the
break it was checked against, in a scratch copy of credit/shuffle.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from mtrl_jax.credit.shuffle import shuffle_decision_advantages, valid_decision_rows

ROWS, COLS = (1, 2, 5, 9, 16), (1, 3, 10)  # shapes from a small set: one compile each, shared by the tests
_shuffle = jax.jit(shuffle_decision_advantages)  # `fraction` and `eligible_b` traced
_valid = jax.jit(valid_decision_rows)


@st.composite
def batches(draw, constant_rows=True, invalid_rates=(0.0, 0.3, 0.6, 1.0), min_q=0.01):
  """(adv, mask, turn, eligible, invalid, seed, q): B x T rows, some padding (mask 0), 0-3 turns with
  random action masks; each row's decision tokens share one distinct value when `constant_rows`
  (the outcome estimators'), else carry per-token values (GAE's); `invalid` flags whole turns."""
  b, t = draw(st.sampled_from(ROWS)), draw(st.sampled_from(COLS))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  cuts = np.sort(rng.integers(0, t + 1, (b, 2)), axis=1)  # turn 0 up to cut 0, turn 1 up to cut 1, then 2
  turn = ((np.arange(t)[None] >= cuts[:, :1]).astype(np.int32) + (np.arange(t)[None] >= cuts[:, 1:])).astype(np.int32)
  mask = (rng.random((b, t)) < draw(st.sampled_from([0.3, 0.7, 1.0]))).astype(np.float32)
  mask[rng.random(b) < 0.2] = 0.0  # padding rows
  adv = rng.standard_normal((b, t)).astype(np.float32)
  dec = (mask > 0) & (turn == 0)
  if constant_rows:
    values = rng.permutation(b).astype(np.float32) * np.float32(rng.uniform(0.1, 3.0)) - np.float32(b / 3)
    adv = np.where(dec, values[:, None], adv).astype(np.float32)
  invalid_turn = rng.random((b, 3)) < draw(st.sampled_from(invalid_rates))
  invalid = np.take_along_axis(invalid_turn, turn, axis=1)
  eligible = np.asarray(_valid(jnp.asarray(mask), jnp.asarray(turn), jnp.asarray(invalid)))
  q = draw(st.floats(min_q, 1.0))
  return adv, mask, turn, eligible, invalid, seed, q


def _run(adv, mask, turn, eligible, seed, q):
  return np.asarray(_shuffle(jnp.asarray(adv), jnp.asarray(mask), jnp.asarray(turn), jax.random.key(seed), q,
                            eligible_b=jnp.asarray(eligible)))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_ineligible_rows_untouched_multiset_kept_and_exactly_round_q_n_eligible_drawn(batch):
  """Rows that are ineligible (an invalid decision reply) or have no decision token, and every token
  off the decision turn, are untouched bit for bit; the eligible rows' decision values are the same
  multiset bit for bit; exactly round(q x n_eligible) eligible rows take another row's value (none
  when that rounds to 1: a cycle of one keeps its own); a drawn row's decision tokens all carry it.

  Breaks checked: `eligible_b` ignored (every row with decision tokens drawn) fails 'ineligible
  untouched'; k = round(q x rows with decision tokens) (eligibility counted after the rounding)
  fails the count; the mean as sum / n (not first value + mean offset) fails 'bit for bit' on the
  multiset (5 of 5 hypothesis seeds); donors drawn from every row with decision tokens fails it too."""
  adv, mask, turn, eligible, _, seed, q = batch
  out = _run(adv, mask, turn, eligible, seed, q)
  dec = (mask > 0) & (turn == 0)
  pool = dec.any(1) & eligible
  np.testing.assert_array_equal(out[~pool], adv[~pool])  # ineligible rows, rows without a decision token
  np.testing.assert_array_equal(out[~dec], adv[~dec])  # every token off the decision turn
  first = lambda a: np.array([a[r, dec[r]][0] for r in np.nonzero(pool)[0]], np.float32)
  np.testing.assert_array_equal(np.sort(first(out)), np.sort(first(adv)))
  k = int(np.floor(np.float32(q) * np.float32(pool.sum()) + np.float32(0.5)))
  changed = first(out) != first(adv)
  assert changed.sum() == (k if k >= 2 else 0), (k, pool.sum(), q)
  for r in np.nonzero(pool)[0]:
    assert np.all(out[r, dec[r]] == out[r, dec[r]][0])


@settings(max_examples=40, deadline=None)
@given(batches(constant_rows=False))
def test_per_token_advantages_drawn_rows_get_an_eligible_rows_mean(batch):
  """With advantages that vary inside the decision turn (GAE), an ineligible row keeps its own tokens
  bit for bit, and a drawn row's decision tokens all carry one value: the mean of some eligible row's
  decision tokens (never an ineligible row's). Break checked: the donor order not restricted to the
  eligible rows (`order` sorting every row with decision tokens first, so an ineligible row's mean is
  handed on) fails here on 4 of 5 hypothesis seeds, the test above on 5 of 5, the count test below always."""
  adv, mask, turn, eligible, _, seed, q = batch
  out = _run(adv, mask, turn, eligible, seed, q)
  dec = (mask > 0) & (turn == 0)
  pool = dec.any(1) & eligible
  np.testing.assert_array_equal(out[~pool], adv[~pool])
  means = {r: adv[r, dec[r]].mean() for r in np.nonzero(pool)[0]}
  for r in np.nonzero(pool)[0]:
    if not np.array_equal(out[r], adv[r]):
      v = out[r, dec[r]]
      assert np.all(v == v[0])
      assert min(abs(v[0] - m) for m in means.values()) < 1e-5


@settings(max_examples=30, deadline=None)
@given(batches(invalid_rates=(0.0, 0.3), min_q=0.5))  # most rows drawn: each a chance to be off by an ulp
def test_constant_advantages_come_back_bit_for_bit(batch):
  """Every advantage equal (a batch with no spread): the control changes nothing, bit for bit,
  whatever is drawn. Break checked: the mean as sum / n (n float copies summed, then divided: off by
  an ulp for about a third of values at n = 3, 5, 6, 7, 9) fails."""
  adv, mask, turn, eligible, _, seed, q = batch
  adv = np.full(adv.shape, np.random.default_rng(seed).uniform(-5.0, 5.0), np.float32)
  np.testing.assert_array_equal(_run(adv, mask, turn, eligible, seed, q), adv)


def test_only_eligible_rows_are_drawn_each_about_q_of_the_time():
  """6 rows with decision tokens, rows 1 and 4 ineligible; q = 0.5 of the 4 eligible -> 2 drawn per key
  (they swap). Over 2000 keys rows 1 and 4 never change and each eligible row changes 0.5 +- 0.05 of
  the time. Break checked: k from all 6 rows (3 drawn) fails 'exactly 2'; the eligibility ignored
  fails 'rows 1 and 4 never'."""
  adv = np.zeros((7, 3), np.float32)
  adv[:6, 0] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  mask = np.zeros((7, 3), np.float32)
  mask[:6, 0] = 1.0
  turn = np.zeros((7, 3), np.int32)
  ok = jnp.asarray([True, False, True, True, False, True, True])
  keys = jax.random.split(jax.random.key(3), 2000)
  out = np.asarray(jax.vmap(lambda k: shuffle_decision_advantages(
      jnp.asarray(adv), jnp.asarray(mask), jnp.asarray(turn), k, 0.5, eligible_b=ok))(keys))[:, :6, 0]
  moved = out != adv[None, :6, 0]
  assert np.all(moved.sum(1) == 2)
  assert not moved[:, [1, 4]].any()
  np.testing.assert_allclose(moved[:, [0, 2, 3, 5]].mean(0), 0.5, atol=0.05)


def test_valid_decision_rows_reads_only_the_decision_turns_action_tokens():
  """A row is ineligible only if an action token (mask > 0) of turn 0 is flagged invalid: an invalid
  later turn or an invalid turn-0 flag on a masked-out token (a turn-layout row's history context)
  leaves it eligible. Break checked: the mask dropped (any turn-0 token) fails row 2; the turn
  dropped (any flagged action token) fails row 1."""
  mask = np.array([[0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 0, 1], [0, 1, 1, 1]], np.float32)
  turn = np.array([[0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]], np.int32)
  invalid = np.array([[0, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1]], bool)
  got = np.asarray(valid_decision_rows(jnp.asarray(mask), jnp.asarray(turn), jnp.asarray(invalid)))
  assert got.tolist() == [False, True, True, True]
