"""Chunked log-probs / entropy: the same numbers and gradients as whole logits, in bounded memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.logprobs import chunked_token_stats, token_stats
from mtrl_jax.models.transformer import Transformer, token_entropy, token_logprobs
from mtrl_jax.train.lm_step import LMBatch, lm_loss


def _inputs(b=2, t=11, d=8, v=37, seed=0):
  r = np.random.default_rng(seed)
  h = jnp.asarray(r.normal(size=(b, t, d)), jnp.float32)
  w = jnp.asarray(r.normal(size=(d, v)) * 0.7, jnp.float32)
  y = jnp.asarray(r.integers(0, v, (b, t)), jnp.int32)
  return h, w, y


def _objective(chunk):
  # Weights that differ per position, so a chunk offset by one changes the value and the gradient.
  def f(h, w, y):
    s = chunked_token_stats(h, w, y, chunk)
    pos = jnp.arange(h.shape[1], dtype=jnp.float32)
    return jnp.sum((s.logp_bt + 0.3 * s.entropy_bt) * (1.0 + pos))
  return f


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 10])
def test_chunked_equals_whole_logits_values_and_grads(chunk):
  """T = 11 with chunks that divide it (1) and that do not (3, 4, 5, 10).

  Catches: a chunk's targets or outputs shifted by one position (verified by
  shifting the chunked targets by one position), a dropped tail chunk, padding that
  leaks into the outputs.
  """
  h, w, y = _inputs()
  whole = chunked_token_stats(h, w, y, 0)
  np.testing.assert_allclose(whole.logp_bt, token_logprobs(h @ w, y), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(whole.entropy_bt, token_entropy(h @ w), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(whole.correct_bt, (jnp.argmax(h @ w, -1) == y).astype(np.float32))
  got = chunked_token_stats(h, w, y, chunk)
  for a, b in zip(got, whole):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  g_whole = jax.grad(_objective(0), argnums=(0, 1))(h, w, y)
  g_chunk = jax.grad(_objective(chunk), argnums=(0, 1))(h, w, y)
  for a, b in zip(g_chunk, g_whole):
    assert float(jnp.max(jnp.abs(b))) > 1.0  # a gradient large against the tolerance
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_negative_chunk_is_refused_and_config_names_the_field():
  h, w, y = _inputs()
  with pytest.raises(ValueError, match="chunk"):
    chunked_token_stats(h, w, y, -1)
  with pytest.raises(ValueError, match="logits_chunk"):
    ModelConfig(logits_chunk=-2)


def _temp_bytes(chunk, t, v=32768, d=64):
  f = jax.jit(jax.value_and_grad(_objective(chunk), argnums=(0, 1)))
  args = (jax.ShapeDtypeStruct((1, t, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
          jax.ShapeDtypeStruct((1, t), jnp.int32))
  return f.lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_loss_and_grad_temp_memory_does_not_grow_with_t_times_v():
  """Compiled temp memory of value_and_grad at V = 32k, T = 256 vs 1024.

  Whole logits grow by >= one [T, V] fp32 buffer per extra position; chunks
  of 128 stay flat. Catches: the chunk body without jax.checkpoint (the scan
  then saves every chunk's logits for the backward pass: +288 MiB measured).
  """
  tv_growth = (1024 - 256) * 32768 * 4
  whole = _temp_bytes(0, 1024) - _temp_bytes(0, 256)
  assert whole >= tv_growth  # the test's yardstick: whole logits do scale
  chunked = _temp_bytes(128, 1024) - _temp_bytes(128, 256)
  assert chunked < 0.05 * tv_growth, chunked


MC = ModelConfig(vocab_size=61, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32)


def _model(chunk):
  import dataclasses
  return Transformer(dataclasses.replace(MC, logits_chunk=chunk), rngs=nnx.Rngs(3))


def test_token_stats_reads_the_model_chunk_and_matches_its_logits():
  m = _model(4)
  toks = jnp.asarray(np.random.default_rng(1).integers(0, 61, (2, 9)), jnp.int32)
  h, _ = m.hidden(toks)
  logits, _ = m(toks)
  s = token_stats(m, h[:, :-1], toks[:, 1:])
  np.testing.assert_allclose(s.logp_bt, token_logprobs(logits[:, :-1], toks[:, 1:]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [3, 8])
def test_sft_loss_and_param_grads_match_unchunked(chunk):
  """lm_loss (T = 15 targets) with logits_chunk 3 / 8 vs 0: loss, accuracy and every parameter's gradient.

  Catches: the SFT loss bypassing or misaligning the chunked path (verified
  with the chunked targets shifted by one position).
  """
  r = np.random.default_rng(2)
  batch = LMBatch(jnp.asarray(r.integers(0, 61, (3, 16)), jnp.int32),
                  jnp.asarray(r.integers(0, 2, (3, 16)), jnp.float32))

  def run(c):
    gd, params = nnx.split(_model(c))
    # jit: one compile per program (eager dispatch compiles every op of the model and its grad)
    return jax.jit(jax.value_and_grad(lambda p: lm_loss(nnx.merge(gd, p), batch), has_aux=True))(params)

  (l0, m0), g0 = run(0)
  (l1, m1), g1 = run(chunk)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(m1["accuracy"], m0["accuracy"])
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
