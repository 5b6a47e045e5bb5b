"""The KV-cache sampler against a reference that recomputes every step from
scratch with a plain forward (no cache): multi-turn, ragged rows, stop ids,
budgets, capacity, behaviour log-probs, determinism, compile bounds."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampling_fixtures import PAD, allowed_set, full_logits, log_softmax, next_logits, random_rows, tiny_policy

from mtrl_jax.models.transformer import token_logprobs
from mtrl_jax.sampling import buckets
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

GREEDY = SamplingParams(greedy=True)
ATOL = 1e-5


@pytest.fixture(scope="module")
def policy():
  return tiny_policy(0)


@pytest.fixture(scope="module")
def sampler(policy):
  # Shared by the tests that do not count compilations: they reuse its programs.
  return Sampler.from_model(policy, pad_id=PAD, stop_ids=[2], log_compiles=False)


def reference_greedy(model, seqs, active, budget, stop_ids, capacity):
  """Greedy continuation of each active row, one full forward per step."""
  seqs = [list(s) for s in seqs]
  toks = [[] for _ in seqs]
  logps = [[] for _ in seqs]
  running = [bool(a) and len(s) < capacity and budget > 0 for a, s in zip(active, seqs)]
  while any(running):
    logp = log_softmax(next_logits(model, [s if s else [PAD] for s in seqs]))
    for b in np.flatnonzero(running):
      tok = int(np.argmax(logp[b]))
      seqs[b].append(tok)
      toks[b].append(tok)
      logps[b].append(logp[b, tok])
      running[b] = not (tok in stop_ids or len(toks[b]) == budget or len(seqs[b]) == capacity)
  return seqs, toks, logps


def test_multi_turn_ragged_greedy_equals_recompute(policy, sampler):
  rng = np.random.default_rng(0)
  capacity = 128
  seqs = [[], [], []]
  state = sampler.init_state(3, capacity)
  turns = [([5, 17, 30], [1, 1, 1]), ([3, 0, 11], [1, 0, 1]), ([7, 9, 1], [1, 1, 1]), ([2, 4, 0], [1, 1, 0])]
  for t, (obs_lengths, active) in enumerate(turns):
    new = random_rows(rng, obs_lengths)
    state = sampler.append(state, new)
    seqs = [s + n for s, n in zip(seqs, new)]
    np.testing.assert_array_equal(sampler.lengths(state), [len(s) for s in seqs])
    np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)

    out, state = sampler.generate(state, jax.random.key(t), 6, active=np.array(active, bool), params=GREEDY)
    seqs, ref_toks, ref_logps = reference_greedy(policy, seqs, active, 6, sampler.stop_ids, capacity)
    for b in range(3):
      assert out.tokens[b].tolist() == ref_toks[b], f"turn {t} row {b}"
      np.testing.assert_allclose(out.logps[b], ref_logps[b], atol=ATOL)
    np.testing.assert_array_equal(sampler.lengths(state), [len(s) for s in seqs])
    np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)


def test_single_row_session_equals_recompute(policy, sampler):
  """Batch 1 decodes one slot per step (its own cache-write path in the model)."""
  rng = np.random.default_rng(12)
  seqs = [[]]
  state = sampler.init_state(1, 96)
  for t, n in enumerate((9, 4, 20)):
    new = random_rows(rng, [n])
    state = sampler.append(state, new)
    seqs = [seqs[0] + new[0]]
    out, state = sampler.generate(state, jax.random.key(t), 7, params=GREEDY)
    seqs, ref_toks, ref_logps = reference_greedy(policy, seqs, [1], 7, sampler.stop_ids, 96)
    assert out.tokens[0].tolist() == ref_toks[0]
    np.testing.assert_allclose(out.logps[0], ref_logps[0], atol=ATOL)
    np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)


def test_stop_ids_and_budgets_per_row(policy):
  rng = np.random.default_rng(1)
  prompts = random_rows(rng, [6, 13, 9])
  free = Sampler.from_model(policy, pad_id=PAD, stop_ids=[], log_compiles=False)
  state = free.append(free.init_state(3, 64), prompts)
  out, _ = free.generate(state, jax.random.key(0), 8, params=GREEDY)
  assert all(len(t) == 8 for t in out.tokens) and out.hit_budget.all()
  # Stop row 0 at the first step whose token it has not produced before.
  row0 = out.tokens[0].tolist()
  cut = next(i for i in range(1, 8) if row0[i] not in row0[:i])
  stop = row0[cut]

  stopping = Sampler.from_model(policy, pad_id=PAD, stop_ids=[stop], log_compiles=False)
  state = stopping.append(stopping.init_state(3, 64), prompts)
  got, state = stopping.generate(state, jax.random.key(0), 8, params=GREEDY)
  seqs, ref_toks, _ = reference_greedy(policy, prompts, [1, 1, 1], 8, [stop], 64)
  assert got.tokens[0].tolist() == row0[:cut + 1]
  for b in range(3):
    assert got.tokens[b].tolist() == ref_toks[b]
    stopped = ref_toks[b][-1] == stop
    assert got.hit_budget[b] == (not stopped and len(ref_toks[b]) == 8)
  assert not got.ended_by_capacity.any()
  # The stop id is cached: the next turn continues after it.
  obs = random_rows(rng, [4, 4, 4])
  state = stopping.append(state, obs)
  np.testing.assert_allclose(np.asarray(state.last_logits_bv),
                             next_logits(policy, [s + o for s, o in zip(seqs, obs)]), atol=ATOL)


def test_budget_counts_differ_between_calls(sampler, policy):
  rng = np.random.default_rng(2)
  prompts = random_rows(rng, [4, 9])
  state = sampler.append(sampler.init_state(2, 64), prompts)
  seqs = prompts
  for budget in (1, 3, 11):
    out, state = sampler.generate(state, jax.random.key(budget), budget, params=GREEDY)
    seqs, ref_toks, _ = reference_greedy(policy, seqs, [1, 1], budget, sampler.stop_ids, 64)
    for b in range(2):
      assert out.tokens[b].tolist() == ref_toks[b]
      assert out.hit_budget[b] == (len(ref_toks[b]) == budget and ref_toks[b][-1] not in sampler.stop_ids)


def test_behaviour_logps_equal_full_forward_logprobs(sampler, policy):
  """Temperature 1, no filters: the returned log-probs are the model's."""
  rng = np.random.default_rng(3)
  seqs = [[], [], [], []]
  gen_pos = [[] for _ in range(4)]
  got = [[] for _ in range(4)]
  state = sampler.init_state(4, 128)
  for turn, lengths in enumerate(([3, 8, 20, 5], [6, 2, 4, 9])):
    new = random_rows(rng, lengths)
    state = sampler.append(state, new)
    seqs = [s + n for s, n in zip(seqs, new)]
    out, state = sampler.generate(state, jax.random.key(10 + turn), 12)
    for b in range(4):
      assert len(out.logps[b]) == len(out.tokens[b]) > 0
      gen_pos[b] += list(range(len(seqs[b]), len(seqs[b]) + len(out.tokens[b])))
      seqs[b] += out.tokens[b].tolist()
      got[b] += out.logps[b].tolist()
  logits = full_logits(policy, seqs)
  targets = np.zeros(logits.shape[:2], np.int32)
  for b, s in enumerate(seqs):
    targets[b, :len(s) - 1] = s[1:]
  ref = np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(targets)))
  for b in range(4):
    np.testing.assert_allclose(got[b], ref[b, np.array(gen_pos[b]) - 1], atol=ATOL)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_k=5),
                                    SamplingParams(temperature=1.3, top_p=0.6),
                                    SamplingParams(temperature=0.9, top_k=12, top_p=0.8)])
def test_filters_restrict_support_and_logps(sampler, policy, params):
  rng = np.random.default_rng(4)
  prompts = random_rows(rng, [5, 11, 7])
  for seed in range(3):
    state = sampler.append(sampler.init_state(3, 64), prompts)
    out, state = sampler.generate(state, jax.random.key(seed), 10, params=params)
    seqs = [p + t.tolist() for p, t in zip(prompts, out.tokens)]
    logits = full_logits(policy, seqs)
    for b in range(3):
      for i, tok in enumerate(out.tokens[b].tolist()):
        support, logp = allowed_set(logits[b, len(prompts[b]) + i - 1], params.temperature, params.top_k,
                                    params.top_p)
        assert tok in support
        np.testing.assert_allclose(out.logps[b][i], logp[tok], atol=1e-4)


def test_same_rng_same_samples(sampler):
  rng = np.random.default_rng(5)
  prompts = random_rows(rng, [4, 10, 6])
  params = SamplingParams(temperature=1.0, top_p=0.95)
  outs = []
  for key in (7, 7, 8):
    state = sampler.append(sampler.init_state(3, 64), prompts)
    out, _ = sampler.generate(state, jax.random.key(key), 16, params=params)
    outs.append(out)
  for b in range(3):
    np.testing.assert_array_equal(outs[0].tokens[b], outs[1].tokens[b])
    np.testing.assert_array_equal(outs[0].logps[b], outs[1].logps[b])
  assert any(outs[0].tokens[b].tolist() != outs[2].tokens[b].tolist() for b in range(3))


def test_inactive_rows_are_untouched(sampler):
  rng = np.random.default_rng(6)
  state = sampler.append(sampler.init_state(3, 64), random_rows(rng, [5, 12, 8]))
  before_logits = np.asarray(state.last_logits_bv).copy()
  before_k = [np.asarray(k).copy() for k in state.cache.k]
  out, state = sampler.generate(state, jax.random.key(0), 5, active=np.array([True, False, True]))
  assert out.tokens[1].size == 0 and out.logps[1].size == 0
  assert not out.hit_budget[1] and not out.ended_by_capacity[1]
  assert out.tokens[0].size > 0 and out.tokens[2].size > 0
  np.testing.assert_array_equal(sampler.lengths(state)[1], 12)
  np.testing.assert_array_equal(np.asarray(state.last_logits_bv)[1], before_logits[1])
  for k_old, k_new in zip(before_k, state.cache.k):
    np.testing.assert_array_equal(np.asarray(k_new)[1, :, :12], k_old[1, :, :12])
  # An empty new-token list leaves the row alone on append as well.
  state = sampler.append(state, [[9], [], [9]])
  np.testing.assert_array_equal(np.asarray(state.last_logits_bv)[1], before_logits[1])


def test_generation_stops_at_capacity(policy):
  s = Sampler.from_model(policy, pad_id=PAD, stop_ids=[], log_compiles=False)
  rng = np.random.default_rng(7)
  prompts = random_rows(rng, [35, 10])
  state = s.append(s.init_state(2, 40), prompts)
  out, state = s.generate(state, jax.random.key(0), 10, params=GREEDY)
  seqs, ref_toks, _ = reference_greedy(policy, prompts, [1, 1], 10, [], 40)
  assert [len(t) for t in out.tokens] == [5, 10]
  assert out.tokens[0].tolist() == ref_toks[0] and out.tokens[1].tolist() == ref_toks[1]
  np.testing.assert_array_equal(out.ended_by_capacity, [True, False])
  np.testing.assert_array_equal(out.hit_budget, [False, True])
  np.testing.assert_array_equal(s.lengths(state), [40, 20])
  out, state = s.generate(state, jax.random.key(1), 10, params=GREEDY)
  assert out.tokens[0].size == 0 and out.ended_by_capacity[0] and not out.hit_budget[0]


def test_append_past_capacity_names_the_row(sampler):
  state = sampler.append(sampler.init_state(3, 32), [[8] * 4, [9] * 30, [10] * 2])
  with pytest.raises(ValueError, match=r"row 1 holds 30 tokens.*capacity 32"):
    sampler.append(state, [[8], [9] * 5, []])
  # Nothing was dispatched: the state is still usable and unchanged.
  np.testing.assert_array_equal(sampler.lengths(state), [4, 30, 2])
  with pytest.raises(ValueError, match="row 2"):
    sampler.append(sampler.init_state(3, 32), [[], [], [8] * 33])


def test_long_append_is_chunked_exactly(policy):
  s = Sampler.from_model(policy, pad_id=PAD, stop_ids=[2], length_buckets=(8, 16), log_compiles=False)
  rng = np.random.default_rng(8)
  rows = random_rows(rng, [50, 3, 0])
  state = s.append(s.init_state(3, 128), rows)
  np.testing.assert_array_equal(s.lengths(state), [50, 3, 0])
  got = np.asarray(state.last_logits_bv)
  np.testing.assert_allclose(got[:2], next_logits(policy, rows[:2]), atol=ATOL)
  np.testing.assert_array_equal(got[2], 0.0)


def test_compile_count_stays_bounded(policy):
  # jax keeps one cache per jitted function, shared by every Sampler: start it
  # empty, or programs compiled by earlier tests in this process are counted too.
  jax.clear_caches()
  s = Sampler.from_model(policy, pad_id=PAD, stop_ids=[2], log_compiles=True)
  rng = np.random.default_rng(9)
  capacity, batch = 128, 2
  state = s.init_state(batch, capacity)
  calls = 0
  for _ in range(40):
    n_new = rng.integers(0, 21, size=batch)
    budget = int(rng.integers(1, 13))
    if (s.lengths(state) + n_new + budget > capacity).any():
      state = s.init_state(batch, capacity)
      n_new = np.maximum(n_new, 1)
    state = s.append(state, random_rows(rng, n_new))
    out, state = s.generate(state, jax.random.key(calls), budget, params=GREEDY)
    calls += 2
  counts = s.compile_count()
  sizes = {buckets.slots_bucket(n, capacity) for n in range(1, capacity + 1)}
  chunks = {buckets.chunk_bucket(n, s.length_buckets) for n in range(1, 21)}
  steps = {buckets.steps_bucket(n) for n in range(1, 13)}
  assert counts["append"] <= len(chunks) * len(sizes)
  assert counts["generate"] <= len(steps) * len(sizes)
  assert counts["grow"] <= len(sizes) * (len(sizes) - 1) // 2
  assert counts["total"] == counts["append"] + counts["generate"] + counts["grow"] < calls // 3
  # The count mirrors jax's own cache of compiled programs where it is exposed.
  if hasattr(s._append_jit, "_cache_size"):
    assert s._append_jit._cache_size() == counts["append"]
    assert s._generate_jit._cache_size() == counts["generate"]
    assert s._grow_jit._cache_size() == counts["grow"]


def test_cache_grows_along_the_ladder_up_to_capacity(sampler, policy):
  rng = np.random.default_rng(11)
  state = sampler.init_state(2, 150)
  assert state.cache.capacity == buckets.MIN_SLOTS
  seqs = [[], []]
  allocated = []
  for n in (10, 60, 30, 45):
    new = random_rows(rng, [n, 3])
    state = sampler.append(state, new)
    seqs = [s + x for s, x in zip(seqs, new)]
    allocated.append(state.cache.capacity)
    assert max(map(len, seqs)) <= state.cache.capacity <= 150
  assert allocated == sorted(allocated) and allocated[-1] == 150 and len(set(allocated)) > 2
  np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)
  out, state = sampler.generate(state, jax.random.key(0), 8, params=GREEDY)
  assert len(out.tokens[0]) == 5 and out.ended_by_capacity[0]
  assert state.cache.capacity == 150 and int(state.capacity) == 150


def test_set_params_swaps_weights_and_checks_shapes(policy):
  s = Sampler.from_model(policy, pad_id=PAD, stop_ids=[], log_compiles=False)
  other = tiny_policy(1)
  prompts = random_rows(np.random.default_rng(10), [6, 6])
  s.set_params(other, version=3)
  assert s.version == 3
  state = s.append(s.init_state(2, 64), prompts)
  out, _ = s.generate(state, jax.random.key(0), 4, params=GREEDY)
  _, ref_toks, _ = reference_greedy(other, prompts, [1, 1], 4, [], 64)
  assert [t.tolist() for t in out.tokens] == ref_toks
  wider = tiny_policy(0, cfg=dataclasses.replace(policy.cfg, mlp_dim=96))
  with pytest.raises(ValueError, match="mlp"):
    s.set_params(wider, version=4)
  assert s.version == 3


def test_argument_errors(sampler):
  state = sampler.append(sampler.init_state(2, 32), [[8, 9], []])
  with pytest.raises(ValueError, match="row 1 has an empty cache"):
    sampler.generate(state, jax.random.key(0), 4)
  with pytest.raises(ValueError, match="active"):
    sampler.generate(state, jax.random.key(0), 4, active=np.ones(3, bool))
  with pytest.raises(ValueError, match="new_tokens has 1 rows"):
    sampler.append(state, [[8]])
  with pytest.raises(ValueError, match="row 0 has token ids outside"):
    sampler.append(state, [[300], []])
  with pytest.raises(ValueError, match="temperature"):
    SamplingParams(temperature=0.0)
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="top_k"):
    SamplingParams(top_k=-1)
  out, state = sampler.generate(state, jax.random.key(0), 0, active=np.array([True, False]))
  assert [t.size for t in out.tokens] == [0, 0] and out.hit_budget.tolist() == [True, False]
