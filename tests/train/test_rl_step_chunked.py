"""The RL step and the score function give the same numbers with chunked log-probs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mtrl_jax.credit.losses import PolicyLossConfig
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.value import PolicyWithValueHead
from mtrl_jax.train.rl_step import LearnerState, RLBatch, StepFlags, make_rl_step, make_score_fn

MC = ModelConfig(vocab_size=97, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32)
B, T = 4, 12


def _batch(seed=0):
  r = np.random.default_rng(seed)
  tokens = r.integers(0, MC.vocab_size, (B, T)).astype(np.int32)
  mask = (r.random((B, T)) < 0.7).astype(np.float32)
  f = lambda *s: r.normal(size=s).astype(np.float32)
  return RLBatch(
      tokens_bt=tokens, targets_bt=np.roll(tokens, -1, axis=1), positions_bt=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
      loss_mask_bt=mask, behav_logp_bt=-4.6 + 0.1 * f(B, T), prox_logp_bt=-4.6 + 0.1 * f(B, T),
      ref_logp_bt=-4.6 + 0.1 * f(B, T), adv_bt=3.0 * f(B, T), value_target_bt=f(B, T), old_value_bt=f(B, T),
      turn_idx_bt=r.integers(0, 3, (B, T)).astype(np.int32), success_bt=np.repeat(np.array([[1], [0], [1], [0]], np.float32), T, axis=1))


def _split(chunk):
  model = PolicyWithValueHead(dataclasses.replace(MC, logits_chunk=chunk), rngs=nnx.Rngs(5))
  # A non-zero value head, so the value loss has a gradient through the trunk too.
  model.value_head.w[...] = jnp.linspace(-1.0, 1.0, MC.dim)
  return nnx.split(model)


def test_rl_update_and_scores_match_unchunked(chunk=5):
  """One SGD(lr=1) step, so the parameter change IS minus the gradient; T = 12, chunk 5 (a ragged tail).

  The loss uses every per-token term (decoupled PPO, KL, NLL, entropy bonus,
  forking-token mask, value head). Catches: a misaligned chunk (verified with
  the chunked targets shifted by one position) and entropy taken from the wrong
  positions.
  """
  cfg = PolicyLossConfig(kl_coef=0.1, ent_coef=0.05, entropy_top_rho=0.5, nll_coef=0.2, max_turns=3)
  batch = jax.tree.map(jnp.asarray, _batch())
  flags = StepFlags(jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.0))
  outs = []
  for c in (0, chunk):
    gd, params = _split(c)
    tx = optax.sgd(1.0)
    step = jax.jit(make_rl_step(gd, None, tx, None, cfg, value_coef=0.5, value_clip=None, decoupled=True))
    state = LearnerState(params, tx.init(params), {}, {})
    new, met = step(state, batch, flags)
    delta = jax.tree.map(lambda a, b: a - b, new.policy, params)
    scores = jax.jit(make_score_fn(gd, None))(params, None, params, batch.tokens_bt, batch.targets_bt,
                                              batch.positions_bt)
    outs.append((delta, met, scores))
  (d0, m0, s0), (d1, m1, s1) = outs
  assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(d0)) > 0.1
  for a, b in zip(jax.tree.leaves(d1), jax.tree.leaves(d0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  for k in ("total_loss", "pg_loss", "entropy", "kl_ref", "nll", "value_loss", "masked_frac_entropy"):
    np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(m1["entropy_by_turn"], m0["entropy_by_turn"], rtol=1e-5)
  for a, b in zip(s1, s0):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
