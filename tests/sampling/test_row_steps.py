"""Per-row decode steps (continuous batching's device half): an action decoded
in pieces, rows starting at different times, equals the lockstep `generate`
with the same per-row keys; rows moved between states continue exactly."""
import jax
import numpy as np
import pytest
from sampling_fixtures import PAD, log_softmax, next_logits, random_rows, tiny_policy

from mtrl_jax.sampling.sampler import Sampler, SamplingParams

# 8 stop ids of 264: a random policy stops every ~30 tokens or so, so actions end at
# different steps (some on a stop id, some on the budget).
STOPS = list(range(2, 10))
HOT = SamplingParams(temperature=1.3)
BUDGET = 16


@pytest.fixture(scope="module")
def policy():
  return tiny_policy(5, head_std=0.05)


@pytest.fixture(scope="module")
def sampler(policy):
  return Sampler.from_model(policy, pad_id=PAD, stop_ids=STOPS, log_compiles=False, version=7)


def _prompts(sampler, rng, lengths):
  state = sampler.append(sampler.init_state(len(lengths), 128), random_rows(rng, lengths, low=30))
  return state


def _keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def test_an_action_decoded_in_pieces_equals_one_generate_call(sampler):
  """Four rows decode their action 5 steps per call, row 3 starting two calls
  late (as a refilled row does); tokens, behaviour log-probs and end flags
  equal one lockstep `generate` call with the same per-row keys.

  Every other call returns once one row's action ended (`done_quota=1`): it
  ran exactly as many steps as that row's last action took.

  Breaks checked: drawing token i with `fold_in(key, step)` instead of
  `fold_in(key, offset + step)` in row_steps.py: the tokens differ from the
  second call on; the quota ignored in the loop condition: the step count
  check fails.
  """
  rng = np.random.default_rng(0)
  lengths = [5, 19, 11, 8]
  keys = _keys(4)
  ref, _ = sampler.generate(_prompts(sampler, np.random.default_rng(0), lengths), keys, BUDGET, params=HOT)
  assert len({len(t) for t in ref.tokens}) > 1  # actions of different lengths
  assert ref.hit_budget.any() and not ref.hit_budget.all()

  state = _prompts(sampler, rng, lengths)
  got = [[] for _ in range(4)]
  logps = [[] for _ in range(4)]
  done = np.zeros(4, bool)
  hit = np.zeros(4, bool)
  calls = 0
  while not done.all():
    active = ~done & (np.arange(4) < 3 if calls < 2 else True)
    offsets = [len(g) for g in got]
    # Odd calls return as soon as one row's action ends (the scheduler's early refill).
    out, state = sampler.decode_rows(state, keys, offsets, [BUDGET] * 4, active, 5, params=HOT,
                                     done_quota=calls % 2)
    assert out.version == 7 and out.steps <= 5
    if calls % 2 and out.done.any():
      assert out.steps == max(len(out.tokens[r]) for r in np.flatnonzero(out.done))
    for r in np.flatnonzero(active):
      got[r] += out.tokens[r].tolist()
      logps[r] += out.logps[r].tolist()
      hit[r] |= out.hit_budget[r]
    done |= out.done
    calls += 1
  for r in range(4):
    assert got[r] == ref.tokens[r].tolist(), r
    np.testing.assert_allclose(logps[r], ref.logps[r], atol=1e-5)
  np.testing.assert_array_equal(hit, ref.hit_budget)


def test_behaviour_logprobs_are_the_models(sampler, policy):
  """Each row's first-call log-probs are the tempered log-softmax of a
  cache-free forward at that prefix (an outside oracle for the per-row
  decode). Break checked: feeding `tok_b` back only for rows that stopped
  (running mask inverted in row_steps.py): the second token's log-prob is off."""
  rng = np.random.default_rng(1)
  rows = random_rows(rng, [6, 13])
  state = sampler.append(sampler.init_state(2, 128), rows)
  out, _ = sampler.decode_rows(state, _keys(2, 3), [0, 0], [BUDGET, BUDGET], [True, True], 4, params=HOT)
  for b in range(2):
    prefix = list(rows[b])
    for tok, lp in zip(out.tokens[b].tolist(), out.logps[b].tolist()):
      ref = log_softmax(next_logits(policy, [prefix])[0] / HOT.temperature)
      assert abs(ref[tok] - lp) < 1e-4
      prefix.append(tok)


def test_parked_rows_come_back_and_continue_exactly(sampler):
  """Rows parked in a store (`move_rows`), their decode rows cleared and
  reused by another session, then loaded into other rows, continue as if never
  moved. Break checked: `move_rows` without the last-logits copy: the first
  token after the load differs; without the lengths: the loaded rows decode
  from position 0."""
  rng = np.random.default_rng(2)
  lengths = [7, 15, 9]
  keys = _keys(3, 5)
  ref_state = _prompts(sampler, np.random.default_rng(2), lengths)
  ref, _ = sampler.generate(ref_state, keys, BUDGET, params=HOT)

  act = _prompts(sampler, rng, lengths)
  store = sampler.init_state(5, 128)
  act, store = sampler.move_rows(act, [0, 1, 2], store, [4, 0, 2])
  act = sampler.clear_rows(act, [0, 1, 2])
  np.testing.assert_array_equal(sampler.lengths(act), [0, 0, 0])
  act = sampler.append(act, random_rows(rng, [30, 3, 12]))  # other sessions use the rows meanwhile
  _, act = sampler.decode_rows(act, _keys(3, 9), [0] * 3, [BUDGET] * 3, [True] * 3, 4, params=HOT)
  store, act = sampler.move_rows(store, [2, 4, 0], act, [0, 1, 2])  # rows 2, 0, 1 of the reference
  np.testing.assert_array_equal(sampler.lengths(act), [lengths[2], lengths[0], lengths[1]])
  out, _ = sampler.decode_rows(act, keys[np.array([2, 0, 1])], [0] * 3, [BUDGET] * 3, [True] * 3, BUDGET,
                               params=HOT)
  for r, src in enumerate([2, 0, 1]):
    assert out.tokens[r].tolist() == ref.tokens[src].tolist()
    np.testing.assert_allclose(out.logps[r], ref.logps[src], atol=1e-5)


def test_append_rows_equals_a_full_append(sampler):
  """Prefilling 2 (padded to 2) and 3 (padded to 4) of 8 rows through
  `append_rows`, a 300-token chunked prompt among them, leaves the same
  caches, lengths and next-token logits as `append` with [] for the other
  rows. Break checked: writing the prefilled rows back to `rows_k + 1`
  (row_steps.append_to_rows): lengths and logits differ."""
  rng = np.random.default_rng(4)
  base = random_rows(rng, [5, 9, 3, 12, 7, 4, 6, 8], low=30)
  turns = [{1: random_rows(rng, [300])[0], 6: random_rows(rng, [11])[0]},
           {0: random_rows(rng, [4])[0], 3: random_rows(rng, [20])[0], 7: random_rows(rng, [2])[0]}]
  full = sampler.append(sampler.init_state(8, 400), base)
  part = sampler.append(sampler.init_state(8, 400), base)
  for new in turns:
    full = sampler.append(full, [new.get(r, []) for r in range(8)])
    part = sampler.append_rows(part, sorted(new), [new[r] for r in sorted(new)])
    np.testing.assert_array_equal(sampler.lengths(part), sampler.lengths(full))
    np.testing.assert_allclose(np.asarray(part.last_logits_bv), np.asarray(full.last_logits_bv), atol=1e-5)
  out_f, _ = sampler.generate(full, _keys(8), 6, params=HOT)
  out_p, _ = sampler.generate(part, _keys(8), 6, params=HOT)
  assert [t.tolist() for t in out_f.tokens] == [t.tolist() for t in out_p.tokens]


def test_decode_rows_rejects_bad_arguments(sampler):
  state = sampler.append(sampler.init_state(2, 64), [[40, 41], []])
  with pytest.raises(ValueError, match="empty cache"):
    sampler.decode_rows(state, _keys(2), [0, 0], [4, 4], [True, True], 4)
  with pytest.raises(ValueError, match="one key per row"):
    sampler.decode_rows(state, jax.random.key(0), [0, 0], [4, 4], [True, False], 4)
  with pytest.raises(ValueError, match="offsets"):
    sampler.decode_rows(state, _keys(2), [0], [4, 4], [True, False], 4)
  with pytest.raises(ValueError, match="rows repeat"):
    sampler.move_rows(state, [0, 1], sampler.init_state(2, 64), [1, 1])
