"""The decoder's own invariants: cache exactness, causality, GQA, dtypes."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer, token_entropy, token_logprobs

CFG = ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                  rope_theta=1000.0, qkv_bias=True, tie_embeddings=False)


def randomized(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """A model whose biases and norms are non-trivial too, with logits of order one.

  Built abstractly and filled from numpy: eager per-op dispatch over 8 fake
  devices is what makes small tests slow.
  """
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    return (1.0 if path[-1] == "scale" else 0.0) + 0.2 * rng.standard_normal(shape)

  return filled(cfg, draw)


def filled(cfg: ModelConfig, value_of) -> Transformer:
  """A Transformer whose parameter at `path` is `value_of(path, shape)`, cast to param_dtype."""
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  for path, var in nnx.to_flat_state(params):
    shape = var.get_value().shape
    var.set_value(jnp.asarray(np.asarray(value_of(tuple(path), shape)), cfg.weight_dtype))
  return nnx.merge(graphdef, params, rest)


def params_of(model):
  return {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def jitted(model):
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens_bt, cache=None, n_new_b=None, positions_bt=None):
    return nnx.merge(graphdef, state)(tokens_bt, cache, n_new_b, positions_bt)

  return lambda *args, **kw: run(state, *args, **kw)


@pytest.fixture(scope="module")
def model():
  return randomized(CFG)


def test_ragged_prefill_chunks_and_steps_equal_full_forward(model):
  b, t = 3, 12
  tokens_bt = np.random.default_rng(0).integers(0, CFG.vocab_size, (b, t))
  fwd = jitted(model)
  full_btv, _ = fwd(jnp.asarray(tokens_bt))
  full_btv = np.asarray(full_btv)

  # Every row reaches t tokens along its own schedule: ragged prefill, a
  # ragged multi-token append (a new turn), then single steps; rows already
  # done append nothing.
  schedule = [np.array([5, 2, 7]), np.array([3, 1, 0]), *([np.ones(b, int)] * t)]
  cache = model.init_cache(b, t)
  done = np.zeros(b, int)
  checked = 0
  for n_new_b in schedule:
    n_new_b = np.minimum(n_new_b, t - done)
    width = max(1, int(n_new_b.max()))
    chunk_bt = np.zeros((b, width), int)  # padding columns hold token 0
    for i in range(b):
      chunk_bt[i, : n_new_b[i]] = tokens_bt[i, done[i]: done[i] + n_new_b[i]]
    logits_btv, cache = fwd(jnp.asarray(chunk_bt), cache, jnp.asarray(n_new_b))
    for i in range(b):
      for j in range(n_new_b[i]):
        np.testing.assert_allclose(np.asarray(logits_btv[i, j]), full_btv[i, done[i] + j], atol=2e-5)
        checked += 1
    done += n_new_b
    np.testing.assert_array_equal(np.asarray(cache.length_b), done)
  assert checked == b * t


def test_capacity_overflow_is_dropped_without_corrupting(model):
  cap = 8
  tokens_bt = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, cap + 2))
  fwd = jitted(model)
  full_btv = np.asarray(fwd(jnp.asarray(tokens_bt))[0])
  cache = model.init_cache(2, cap)
  # Row 0 fills the cache; row 1 keeps room.
  _, cache = fwd(jnp.asarray(tokens_bt[:, :cap]), cache, jnp.array([cap, 3]))
  before_k = [np.asarray(k) for k in cache.k]
  chunk = np.stack([tokens_bt[0, cap: cap + 2], tokens_bt[1, 3:5]])
  logits_btv, cache = fwd(jnp.asarray(chunk), cache, jnp.array([2, 2]))
  assert cache.capacity == cap
  for k_old, k_new in zip(before_k, cache.k):  # [B, KV, S, hd]
    np.testing.assert_array_equal(np.asarray(k_new)[0], k_old[0])  # over-full row untouched
    np.testing.assert_array_equal(np.asarray(k_new)[1, :, :3], k_old[1, :, :3])
  np.testing.assert_allclose(np.asarray(logits_btv[1]), full_btv[1, 3:5], atol=2e-5)
  assert np.all(np.isfinite(np.asarray(logits_btv)))


def test_future_tokens_do_not_change_past_logits(model):
  tokens_bt = np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 10))
  changed = tokens_bt.copy()
  changed[:, 6] = (changed[:, 6] + 1) % CFG.vocab_size
  fwd = jitted(model)
  a, b = np.asarray(fwd(jnp.asarray(tokens_bt))[0]), np.asarray(fwd(jnp.asarray(changed))[0])
  np.testing.assert_array_equal(a[:, :6], b[:, :6])
  assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-3


def test_explicit_positions_match_default_and_shift_rope(model):
  tokens_bt = jnp.asarray(np.random.default_rng(3).integers(0, CFG.vocab_size, (1, 6)))
  fwd = jitted(model)
  default = np.asarray(fwd(tokens_bt)[0])
  same = np.asarray(fwd(tokens_bt, positions_bt=jnp.arange(6)[None])[0])
  shifted = np.asarray(fwd(tokens_bt, positions_bt=jnp.arange(6)[None] + 5)[0])
  np.testing.assert_allclose(same, default, atol=1e-6)
  # Rotary attention depends on relative positions only.
  np.testing.assert_allclose(shifted, default, atol=1e-4)


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_gqa_equals_mha_with_repeated_kv_heads(n_heads, n_kv_heads):
  cfg = dataclasses.replace(CFG, n_heads=n_heads, n_kv_heads=n_kv_heads)
  gqa = randomized(cfg, seed=4)
  src, rep = params_of(gqa), n_heads // n_kv_heads

  def repeated(path, shape):
    # Query head h reads kv head h // rep: repeat each kv head rep times in place.
    if path[-1] in ("wk", "wv"):
      return np.repeat(src[path], rep, axis=1)
    if path[-1] in ("bk", "bv"):
      return np.repeat(src[path], rep, axis=0)
    return src[path]

  mha = filled(dataclasses.replace(cfg, n_kv_heads=n_heads), repeated)
  tokens_bt = jnp.asarray(np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 7)))
  np.testing.assert_allclose(np.asarray(jitted(gqa)(tokens_bt)[0]), np.asarray(jitted(mha)(tokens_bt)[0]),
                             atol=1e-5)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bf16_compute_is_close_to_fp32(model, param_dtype):
  tokens_bt = jnp.asarray(np.random.default_rng(6).integers(0, CFG.vocab_size, (2, 9)))
  want = np.asarray(jitted(model)(tokens_bt)[0])
  cfg16 = dataclasses.replace(CFG, dtype="bfloat16", param_dtype=param_dtype)
  src = params_of(model)
  m16 = filled(cfg16, lambda path, shape: src[path])
  got, _ = jitted(m16)(tokens_bt)
  assert got.dtype == jnp.float32 and m16.embed[...].dtype == cfg16.weight_dtype
  err = np.abs(np.asarray(got) - want).max()
  assert 0 < err < 0.05 * np.abs(want).max()
  # Rounding moves logits, not the decision where the margin is clear.
  top2 = np.sort(want, -1)[..., -2:]
  clear = (top2[..., 1] - top2[..., 0]) > 4 * err
  assert clear.any()
  np.testing.assert_array_equal(np.asarray(got).argmax(-1)[clear], want.argmax(-1)[clear])


def test_tied_embeddings_use_the_embedding_as_head():
  cfg = dataclasses.replace(CFG, tie_embeddings=True)
  m = randomized(cfg, seed=7)
  assert not hasattr(m, "lm_head")
  graphdef, state = nnx.split(m)

  @jax.jit
  def hidden_and_logits(state, tokens_bt):
    model = nnx.merge(graphdef, state)
    h_btd, _ = model.hidden(tokens_bt)
    return h_btd, model.logits(h_btd)

  h_btd, logits_btv = hidden_and_logits(state, jnp.arange(3)[None])
  np.testing.assert_allclose(np.asarray(logits_btv), np.asarray(h_btd) @ np.asarray(m.embed[...]).T, atol=1e-4)
  trunk = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), lm_head=False))
  with pytest.raises(ValueError, match="lm_head=False"):
    trunk.logits(h_btd)


def test_token_logprobs_and_entropy_match_numpy():
  logits_btv = np.random.default_rng(8).normal(size=(2, 3, 5)).astype(np.float32) * 3
  targets_bt = np.array([[0, 4, 2], [1, 1, 3]])
  logp = logits_btv - np.log(np.exp(logits_btv).sum(-1, keepdims=True))
  want_lp = np.take_along_axis(logp, targets_bt[..., None], -1)[..., 0]
  want_h = -(np.exp(logp) * logp).sum(-1)
  np.testing.assert_allclose(np.asarray(token_logprobs(jnp.asarray(logits_btv), jnp.asarray(targets_bt))),
                             want_lp, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(token_entropy(jnp.asarray(logits_btv))), want_h, rtol=1e-5)
