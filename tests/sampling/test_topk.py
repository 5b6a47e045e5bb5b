"""Token choice alone: support of the filters, behaviour log-probs, and the
sampled frequencies against the filtered distribution."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sampling_fixtures import allowed_set, log_softmax

from mtrl_jax.sampling.records import SamplingParams
from mtrl_jax.sampling.topk import SampleMode, choose_tokens, sample_mode

V = 24


@functools.lru_cache(maxsize=None)
def _chooser(mode: SampleMode):
  return jax.jit(lambda logits, key, t, p: choose_tokens(logits, key, t, p, mode))


def choose(logits_bv, key, params: SamplingParams):
  mode = sample_mode(params, logits_bv.shape[-1])
  tok, logp = _chooser(mode)(jnp.asarray(logits_bv), key, jnp.float32(params.temperature),
                             jnp.float32(params.top_p))
  return np.asarray(tok), np.asarray(logp)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), temperature=st.floats(0.2, 3.0), top_k=st.sampled_from([0, 1, 3, 10, V, 99]),
       top_p=st.sampled_from([1.0, 0.9, 0.5, 0.05]), scale=st.floats(0.1, 8.0))
def test_samples_stay_in_the_filtered_support(seed, temperature, top_k, top_p, scale):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.standard_normal((6, V))).astype(np.float32)
  params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
  tok, logp = choose(logits, jax.random.key(seed), params)
  for b in range(6):
    support, ref_logp = allowed_set(logits[b], temperature, top_k, top_p)
    assert tok[b] in support
    np.testing.assert_allclose(logp[b], ref_logp[tok[b]], rtol=1e-5, atol=1e-5)
    if top_k:
      assert len(support) <= top_k


def test_greedy_takes_argmax_with_temperature_one_logp():
  logits = np.random.default_rng(0).standard_normal((5, V)).astype(np.float32)
  tok, logp = choose(logits, jax.random.key(0), SamplingParams(greedy=True, temperature=0.3, top_k=2))
  np.testing.assert_array_equal(tok, logits.argmax(-1))
  np.testing.assert_allclose(logp, log_softmax(logits)[np.arange(5), tok], atol=1e-6)


def test_sampled_frequencies_match_the_filtered_distribution():
  """4000 draws of one row: empirical frequencies within 5 sigma of the
  reference probabilities, and nothing outside the support."""
  logits = np.random.default_rng(1).standard_normal(V).astype(np.float32) * 1.5
  n = 4000
  for params in (SamplingParams(), SamplingParams(temperature=0.5, top_k=6), SamplingParams(top_p=0.7),
                 SamplingParams(temperature=2.0, top_k=8, top_p=0.8)):
    tok, _ = choose(np.broadcast_to(logits, (n, V)), jax.random.key(2), params)
    support, ref_logp = allowed_set(logits, params.temperature, params.top_k, params.top_p)
    assert set(np.unique(tok).tolist()) <= support
    freq = np.bincount(tok, minlength=V) / n
    p = np.exp(ref_logp)
    sigma = np.sqrt(p * (1 - p) / n) + 1e-3
    assert np.all(np.abs(freq - p) < 5 * sigma), (params, freq, p)


def test_sample_mode_turns_ineffective_filters_off():
  assert sample_mode(SamplingParams(top_k=500), 264) == SampleMode(False, 0, False)
  assert sample_mode(SamplingParams(top_k=5, top_p=0.9), 264) == SampleMode(False, 5, True)
  assert sample_mode(SamplingParams(greedy=True, top_k=5), 264) == SampleMode(True, 0, False)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), top_k=st.sampled_from([0, 5]), top_p=st.sampled_from([1.0, 0.8]),
       rows=st.integers(2, 7))
def test_with_a_key_per_row_a_row_draws_the_same_in_any_batch(seed, top_k, top_p, rows):
  """Per-row keys ([B] keys): each row's token and log-prob equal a one-row
  draw with that row's key, whatever the other rows are, so a session's
  tokens do not depend on the batch it is played in (multi-host ownership).

  Catches a per-row key ignored (one key used for the batch): the draws of a
  row then change with its position and batch (checked over 20 examples).
  """
  rng = np.random.default_rng(seed)
  logits = (3.0 * rng.standard_normal((rows, V))).astype(np.float32)
  keys = jax.random.split(jax.random.key(seed), rows)
  params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
  tok, logp = choose(logits, keys, params)
  for b in range(rows):
    t1, l1 = choose(logits[b:b + 1], keys[b:b + 1], params)
    assert tok[b] == t1[0]
    np.testing.assert_allclose(logp[b], l1[0], rtol=1e-6)
  # Shuffling the rows (with their keys) permutes the draws.
  perm = rng.permutation(rows)
  tok_p, _ = choose(logits[perm], keys[perm], params)
  np.testing.assert_array_equal(tok_p, tok[perm])
