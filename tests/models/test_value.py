"""Critics: per-token values, the policy warm start, the shared-trunk option."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic, PolicyWithValueHead, copy_trunk

CFG = ModelConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=24,
                  qkv_bias=True, tie_embeddings=False)


def trunk_params(module):
  flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
  return {tuple(p): np.asarray(v.get_value()) for p, v in flat if p[0] != "lm_head"}


def set_head(head, seed):
  rng = np.random.default_rng(seed)
  head.w.set_value(jnp.asarray(rng.standard_normal(head.w[...].shape), jnp.float32))
  head.b.set_value(jnp.asarray(0.5, jnp.float32))


# Eager dispatch over 8 fake devices is slow: every forward here is jitted.
call = nnx.jit(lambda module, tokens_bt: module(tokens_bt))
hidden = nnx.jit(lambda trunk, tokens_bt: trunk.hidden(tokens_bt)[0])


@pytest.fixture(scope="module")
def policy():
  return Transformer(CFG, rngs=nnx.Rngs(1))


def test_critic_gives_one_value_per_token_and_starts_at_zero():
  critic = Critic(CFG, rngs=nnx.Rngs(0))
  tokens_bt = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (3, 5)))
  v_bt = call(critic, tokens_bt)
  assert v_bt.shape == (3, 5) and v_bt.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(v_bt), 0.0)
  assert not hasattr(critic.trunk, "lm_head")

  set_head(critic.head, 0)
  h_btd = hidden(critic.trunk, tokens_bt)
  want = np.asarray(h_btd) @ np.asarray(critic.head.w[...]) + 0.5
  np.testing.assert_allclose(np.asarray(call(critic, tokens_bt)), want, atol=1e-5)


def test_from_policy_copies_the_trunk_exactly_and_independently(policy):
  critic = Critic.from_policy(policy, rngs=nnx.Rngs(9))
  want = trunk_params(policy)
  got = trunk_params(critic.trunk)
  assert set(got) == set(want)
  for path in want:
    np.testing.assert_array_equal(got[path], want[path])
  tokens_bt = jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 4)))
  np.testing.assert_array_equal(np.asarray(hidden(critic.trunk, tokens_bt)),
                                np.asarray(hidden(policy, tokens_bt)))
  # A copy, not an alias: training the critic must not move the policy.
  critic.trunk.embed.set_value(critic.trunk.embed[...] + 1.0)
  np.testing.assert_array_equal(np.asarray(policy.embed[...]), want[("embed",)])


def test_copy_trunk_names_missing_parameters(policy):
  biased = Transformer(dataclasses.replace(CFG, qkv_bias=False), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="bq"):
    copy_trunk(biased, Transformer(CFG, rngs=nnx.Rngs(0), lm_head=False))


def test_policy_with_value_head_shares_the_trunk(policy):
  both = PolicyWithValueHead(CFG, rngs=nnx.Rngs(2), policy=policy)
  set_head(both.value_head, 3)
  tokens_bt = jnp.asarray(np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 6)))
  logits_btv, v_bt = call(both, tokens_bt)
  np.testing.assert_allclose(np.asarray(logits_btv), np.asarray(call(policy, tokens_bt)[0]), atol=1e-6)
  h_btd = hidden(policy, tokens_bt)
  assert v_bt.shape == (2, 6)
  np.testing.assert_allclose(np.asarray(v_bt), np.asarray(both.value_head(h_btd)), atol=1e-6)

  # The value loss reaches the shared trunk (that is the point of this option).
  def value_loss(model):
    return jnp.mean(model(tokens_bt)[1] ** 2)

  grads = nnx.jit(nnx.grad(value_loss))(both)
  assert float(jnp.abs(grads.policy.embed[...]).max()) > 0
  assert float(jnp.abs(jax.tree.leaves(grads.value_head)[0]).max()) > 0
