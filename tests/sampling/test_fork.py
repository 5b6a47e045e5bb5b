"""Forking a live decode state: children hold their parent's cache and
continue exactly like it (checked against a cache-free forward)."""
import jax
import numpy as np
import pytest
from sampling_fixtures import PAD, next_logits, random_rows, tiny_policy

from mtrl_jax.sampling.sampler import Sampler, SamplingParams

GREEDY = SamplingParams(greedy=True)
ATOL = 1e-5


@pytest.fixture(scope="module")
def policy():
  return tiny_policy(3)


@pytest.fixture(scope="module")
def sampler(policy):
  return Sampler.from_model(policy, pad_id=PAD, stop_ids=[2], log_compiles=False)


def _two_turn_state(sampler, rng):
  """Three rows of different lengths, with a generated turn in the cache."""
  state = sampler.append(sampler.init_state(3, 128), random_rows(rng, [5, 19, 11]))
  out, state = sampler.generate(state, jax.random.key(0), 6, params=SamplingParams(temperature=1.0))
  state = sampler.append(state, random_rows(rng, [4, 0, 7]))
  return state


def test_greedy_child_continues_like_its_parent(sampler, policy):
  """Catches a fork that copies the wrong row, drops the lengths or the last
  logits (a child would then decode different tokens than its parent), and a
  parent whose state is consumed by the fork."""
  rng = np.random.default_rng(0)
  state = _two_turn_state(sampler, rng)
  lengths = sampler.lengths(state)
  kids = sampler.fork(state, [2, 0], 3)
  np.testing.assert_array_equal(sampler.lengths(kids), np.repeat(lengths[[2, 0]], 3))
  np.testing.assert_allclose(np.asarray(kids.last_logits_bv),
                             np.repeat(np.asarray(state.last_logits_bv)[[2, 0]], 3, axis=0), atol=0)
  out_p, state = sampler.generate(state, jax.random.key(1), 10, params=GREEDY)
  out_k, kids = sampler.generate(kids, jax.random.key(2), 10, params=GREEDY)
  for i, parent in enumerate([2, 0]):
    for j in range(3):
      assert out_k.tokens[i * 3 + j].tolist() == out_p.tokens[parent].tolist()
      np.testing.assert_allclose(out_k.logps[i * 3 + j], out_p.logps[parent], atol=ATOL)
  # Another turn on top: the children's caches hold the same prefix as the parents'.
  new = random_rows(rng, [6, 6, 6])
  state = sampler.append(state, new)
  kids = sampler.append(kids, [new[p] for p in (2, 2, 2, 0, 0, 0)])
  np.testing.assert_allclose(np.asarray(kids.last_logits_bv),
                             np.repeat(np.asarray(state.last_logits_bv)[[2, 0]], 3, axis=0), atol=ATOL)


def test_sampled_children_diverge_and_keys_decide(sampler):
  """Children of one parent sampled with different keys (or in different rows
  of one draw) differ; the same key reproduces the same tokens. Catches a
  fork that also freezes the sampling (e.g. copies a finished row)."""
  rng = np.random.default_rng(1)
  state = _two_turn_state(sampler, rng)
  hot = SamplingParams(temperature=2.0)
  runs = []
  for key in (5, 6, 5):
    kids = sampler.fork(state, [1], 4)
    out, _ = sampler.generate(kids, jax.random.key(key), 12, params=hot)
    runs.append([t.tolist() for t in out.tokens])
  assert runs[0] == runs[2]
  assert runs[0] != runs[1]
  assert len({tuple(t) for t in runs[0]}) > 1


def test_copy_rows_in_place_matches_a_cache_free_forward(sampler, policy):
  """Row 0 forks into rows 1 and 2 (whose own contents are dropped), then every
  row decodes: each must match a plain forward over its token history.
  Catches a copy that leaves the old length (positions would be wrong) or
  writes a destination before reading a source."""
  rng = np.random.default_rng(2)
  prompts = random_rows(rng, [9, 3, 14])
  state = sampler.append(sampler.init_state(3, 128), prompts)
  # Row 1 is both read (into row 2) and written (from row 0): a source must be read first.
  state = sampler.copy_rows(state, [0, 1], [1, 2])
  seqs = [prompts[0], prompts[0], prompts[1]]
  np.testing.assert_array_equal(sampler.lengths(state), [len(s) for s in seqs])
  np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)
  out, state = sampler.generate(state, jax.random.key(3), 5, params=SamplingParams(temperature=1.5))
  seqs = [s + t.tolist() for s, t in zip(seqs, out.tokens)]
  more = random_rows(rng, [2, 5, 1])
  state = sampler.append(state, more)
  seqs = [s + m for s, m in zip(seqs, more)]
  np.testing.assert_allclose(np.asarray(state.last_logits_bv), next_logits(policy, seqs), atol=ATOL)


def test_fork_rejects_bad_rows(sampler):
  state = sampler.append(sampler.init_state(2, 64), [[9, 9], [8]])
  with pytest.raises(ValueError, match="outside"):
    sampler.fork(state, [2], 2)
  with pytest.raises(ValueError, match="repeat"):
    sampler.copy_rows(state, [0, 1], [1, 1])
