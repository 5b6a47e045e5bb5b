"""The generic sharded step on a Critic value-regression loss: parity with one device."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.value import Critic
from mtrl_jax.parallel import (create_sharded, get_rules, init_opt_state, make_grad_fn, make_mesh, make_train_step,
                               opt_state_shardings, shard_batch, state_shardings)

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
MESHES = [((8, 1, 1), "default"), ((1, 8, 1), "default"), ((2, 2, 2), "default"), ((1, 4, 2), "default"),
          ((2, 4, 1), "fsdp")]


class ValueBatch(NamedTuple):
  tokens_bt: np.ndarray
  target_bt: np.ndarray
  mask_bt: np.ndarray


def _critic():
  critic = Critic(CFG, rngs=nnx.Rngs(1))
  # The head starts at zero, which would leave every trunk gradient zero.
  critic.head.w.set_value(0.1 * jax.random.normal(jax.random.key(2), (CFG.dim,)))
  return critic


def _value_loss_fn(graphdef):
  def loss_fn(params, batch):
    v_bt = nnx.merge(graphdef, params)(batch.tokens_bt)
    mask = batch.mask_bt.astype(jnp.float32)
    loss = jnp.sum(mask * (v_bt - batch.target_bt) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"v_mean": jnp.sum(mask * v_bt) / jnp.maximum(jnp.sum(mask), 1.0)}
  return loss_fn


def _batch(seed=0, b=8, t=10):
  rng = np.random.default_rng(seed)
  return ValueBatch(rng.integers(8, 264, (b, t)).astype(np.int32),
                    0.1 * rng.normal(size=(b, t)).astype(np.float32),
                    (rng.random((b, t)) < 0.8).astype(np.float32))


@pytest.fixture(scope="module")
def reference():
  """Single-device loss and gradients, computed once for all meshes."""
  graphdef, params = nnx.split(_critic(), nnx.Param)
  batch = _batch()
  grad = jax.jit(jax.value_and_grad(_value_loss_fn(graphdef), has_aux=True))
  (loss, _), grads = grad(params, batch)
  return graphdef, params, batch, float(loss), jax.tree.leaves(grads)


@pytest.mark.parametrize("shape,preset", MESHES)
def test_value_loss_and_grads_match_one_device(reference, shape, preset):
  graphdef, ref_params, batch, ref_loss, ref_grads = reference
  mesh, rules = make_mesh(shape), get_rules(preset)
  shardings = state_shardings(ref_params, mesh, rules)
  params = jax.device_put(ref_params, shardings)
  grad_fn = make_grad_fn(_value_loss_fn(graphdef), mesh=mesh, rules=rules, param_shardings=shardings)
  loss, _, grads = grad_fn(params, shard_batch(batch, mesh, rules))
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-6)
  leaves = jax.tree.leaves(grads)
  assert max(float(jnp.abs(g).max()) for g in ref_grads) > 1e-3  # not a vacuous comparison
  for g, r, s in zip(leaves, ref_grads, jax.tree.leaves(shardings), strict=True):
    assert g.sharding.spec == s.spec  # gradients come back in the parameters' layout
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def test_opt_state_follows_param_shardings():
  mesh, rules = make_mesh((1, 4, 2)), get_rules("default")
  graphdef, params = nnx.split(_critic(), nnx.Param)
  shardings = state_shardings(params, mesh, rules)
  params = jax.device_put(params, shardings)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  opt_state = init_opt_state(opt, params, opt_state_shardings(opt, params, shardings, mesh))
  adam = opt_state[1][0]
  assert adam.mu["trunk"]["layers"][0]["attn"]["wq"][...].sharding.spec == P("fsdp", "tensor", None)
  assert adam.nu["trunk"]["embed"][...].sharding.spec == P("tensor", "fsdp")
  assert adam.count.sharding.spec == P()


def test_critic_train_step_created_sharded_and_donated():
  mesh, rules = make_mesh((1, 4, 2)), get_rules("default")
  critic = create_sharded(_critic, mesh, rules)
  assert critic.trunk.layers[0].mlp.w_gate[...].sharding.spec == P("fsdp", "tensor")
  graphdef, params = nnx.split(critic, nnx.Param)
  shardings = state_shardings(params, mesh, rules)
  opt = optax.adam(3e-3)
  opt_shardings = opt_state_shardings(opt, params, shardings, mesh)
  opt_state = init_opt_state(opt, params, opt_shardings)
  step = make_train_step(_value_loss_fn(graphdef), opt, mesh=mesh, rules=rules, param_shardings=shardings,
                         opt_shardings=opt_shardings)
  batch = shard_batch(_batch(seed=3), mesh, rules)
  losses = []
  for _ in range(4):
    old = jax.tree.leaves(params)[0]
    params, opt_state, metrics = step(params, opt_state, batch)
    assert old.is_deleted()
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]
