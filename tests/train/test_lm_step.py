"""The masked next-token step: loss semantics, parity with one device on many meshes, donation."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel import get_rules, make_grad_fn, make_mesh, shard_batch, state_shardings
from mtrl_jax.train.lm_step import LMBatch, build_lm_trainer, lm_loss_fn

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
MESHES = [((8, 1, 1), "default"), ((1, 8, 1), "default"), ((2, 2, 2), "default"), ((1, 4, 2), "default"),
          ((2, 4, 1), "fsdp")]


def _factory():
  return Transformer(CFG, rngs=nnx.Rngs(0))


def _batch(seed=0, b=8, t=12):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(8, 264, (b, t)).astype(np.int32)
  return LMBatch(tokens, (rng.random((b, t)) < 0.7).astype(np.float32))


@pytest.fixture(scope="module")
def reference():
  """Single-device loss and gradients, computed once for all meshes."""
  graphdef, params = nnx.split(_factory(), nnx.Param)
  batch = _batch()
  (loss, _), grads = jax.jit(jax.value_and_grad(lm_loss_fn(graphdef), has_aux=True))(params, batch)
  return graphdef, params, batch, float(loss), jax.tree.leaves(grads)


def test_loss_counts_masked_targets_only():
  graphdef, params = nnx.split(_factory(), nnx.Param)
  batch = _batch(seed=1, b=2, t=7)
  loss_fn = jax.jit(lm_loss_fn(graphdef))
  loss, metrics = loss_fn(params, batch)
  logits = jax.jit(lambda p, tok: nnx.merge(graphdef, p)(tok)[0])(params, batch.tokens_bt)
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  picked = [-logp[b, t - 1, batch.tokens_bt[b, t]]
            for b in range(2) for t in range(1, 7) if batch.loss_mask_bt[b, t] == 1]
  assert float(metrics["n_tokens"]) == len(picked) > 0
  np.testing.assert_allclose(float(loss), np.mean(picked), rtol=1e-5)
  # Column 0 has no prediction, so its mask never matters.
  flipped = LMBatch(batch.tokens_bt, batch.loss_mask_bt.copy())
  flipped.loss_mask_bt[:, 0] = 1 - flipped.loss_mask_bt[:, 0]
  np.testing.assert_allclose(float(loss_fn(params, flipped)[0]), float(loss), rtol=1e-6)


def test_empty_mask_gives_zero_loss_not_nan():
  batch = LMBatch(_batch().tokens_bt, np.zeros((8, 12), np.float32))
  graphdef, params = nnx.split(_factory(), nnx.Param)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(lm_loss_fn(graphdef), has_aux=True))(params, batch)
  assert float(loss) == 0.0 and float(metrics["n_tokens"]) == 0.0
  assert all(bool(jnp.all(g == 0)) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("shape,preset", MESHES)
def test_loss_and_grads_match_one_device(reference, shape, preset):
  graphdef, ref_params, batch, ref_loss, ref_grads = reference
  mesh, rules = make_mesh(shape), get_rules(preset)
  shardings = state_shardings(ref_params, mesh, rules)
  params = jax.device_put(ref_params, shardings)
  grad_fn = make_grad_fn(lm_loss_fn(graphdef), mesh=mesh, rules=rules, param_shardings=shardings)
  loss, metrics, grads = grad_fn(params, shard_batch(batch, mesh, rules))
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-6)
  assert float(metrics["n_tokens"]) == batch.loss_mask_bt[:, 1:].sum()
  assert max(float(jnp.abs(g).max()) for g in ref_grads) > 1e-3  # not a vacuous comparison
  for g, r, s in zip(jax.tree.leaves(grads), ref_grads, jax.tree.leaves(shardings), strict=True):
    assert g.sharding.spec == s.spec
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def _one_device_steps(graphdef, host_params, opt, batches):
  """The same optimisation without any mesh: the oracle for the sharded trainer."""
  loss_fn = lm_loss_fn(graphdef)

  @jax.jit
  def step(p, s, b):
    (loss, _), g = jax.value_and_grad(loss_fn, has_aux=True)(p, b)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

  params, state, losses = host_params, opt.init(host_params), []
  for b in batches:
    params, state, loss = step(params, state, b)
    losses.append(float(loss))
  return params, losses


def test_trainer_is_sharded_donated_and_matches_one_device():
  mesh, rules = make_mesh((2, 2, 2)), get_rules("default")
  # Linear in the gradients, so float32 noise stays small; Adam's g/sqrt(v)
  # would blow tiny gradient differences up to full-size update differences.
  opt = optax.chain(optax.add_decayed_weights(1e-2), optax.sgd(0.5, momentum=0.9))
  trainer = build_lm_trainer(_factory, opt, mesh, rules)
  wq = trainer.params["layers"][0]["attn"]["wq"][...]
  assert wq.sharding.spec == P("fsdp", "tensor", None)
  assert {s.data.shape for s in wq.addressable_shards} == {(16, 2, 8)}
  host_params = jax.device_get(trainer.params)
  batches = [_batch(seed=4)] * 3  # one batch, so the loss must fall

  losses = []
  for b in batches:
    old_param, old_moment = jax.tree.leaves(trainer.params)[0], jax.tree.leaves(trainer.opt_state)[0]
    metrics = trainer.train_step(b)
    assert old_param.is_deleted() and old_moment.is_deleted()  # donated, reused in place
    losses.append(float(metrics["loss"]))
  assert trainer.params["layers"][0]["attn"]["wq"][...].sharding.spec == P("fsdp", "tensor", None)

  ref_params, ref_losses = _one_device_steps(trainer.graphdef, host_params, opt, batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
  for a, r in zip(jax.tree.leaves(trainer.params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-5, atol=1e-6)
  assert losses[-1] < losses[0]

  with pytest.raises(ValueError, match=r"batch field tokens_bt rows=6 is not divisible by the 4 batch shards"):
    trainer.train_step(_batch(b=6))
