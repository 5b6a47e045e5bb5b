"""The RL learner: one update is the same on every mesh, and env-error sessions never train."""
import copy

import jax
import numpy as np
import pytest
from flax import nnx

from configs.common import default_config, shrink
from mtrl_jax.envs import registry
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic
from mtrl_jax.parallel.mesh import make_mesh
from mtrl_jax.parallel.rules import get_rules
from mtrl_jax.parallel.sharded_init import create_sharded
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler
from mtrl_jax.train.learner import Learner
from tiny_world import SpreadEnv, flat, host

MC = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


@pytest.fixture(scope="module")
def sessions():
  tok = ByteTokenizer()
  model = Transformer(MC, rngs=nnx.Rngs(0))
  sampler = Sampler.from_model(model, pad_id=tok.pad_id, stop_ids=(tok.eos_id,))
  registry.names()
  eng = RolloutEngine(sampler, tok, lambda: registry.make("memory", length=1), group_size=4,
                      turn_token_budget=6, context_cap=128, num_env_threads=2)
  return eng.run([11, 12], jax.random.key(0)).sessions


@pytest.fixture(scope="module")
def spread_sessions():
  """16 sessions whose returns differ within each group (non-zero advantages)."""
  tok = ByteTokenizer()
  sampler = Sampler.from_model(Transformer(MC, rngs=nnx.Rngs(0)), pad_id=tok.pad_id, stop_ids=(tok.eos_id,))
  eng = RolloutEngine(sampler, tok, SpreadEnv, group_size=4, turn_token_budget=6, context_cap=128,
                      num_env_threads=2)
  out = eng.run([11, 12, 13, 14], jax.random.key(0)).sessions
  assert len({s.episode_return for s in out}) > 1
  return out


def _config(estimator, critic):
  c = shrink(default_config())
  c.critic.kind = critic
  c.rl.estimator = estimator
  c.rl.minibatches = 2
  return c


MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2)]  # (data, fsdp, tensor)
# Every mesh for the critic-free update; the critic's update on the mixed mesh.
PARITY_CASES = [(shape, "ms_grpo", "none") for shape in MESHES] + [((2, 2, 2), "gae", "separate")]
TOL_NORM = 1e-3  # the tolerance, as a fraction of the update's norm
_reference = {}


def _parity_config(estimator, critic):
  c = _config(estimator, critic)
  # No warm-up: the first Adam step already moves every parameter by about
  # lr, so the compared update is large against the tolerance.
  c.rl.update(lr=1e-3, critic_lr=1e-3, warmup_steps=0)
  return c


def _update_on(c, shape, sessions):
  """(policy update, critic update, metrics) of one learner update on a mesh of `shape`."""
  n = int(np.prod(shape))
  learner = _learner_on(c, make_mesh(shape, devices=jax.devices()[:n]))
  p0, c0 = flat(host(learner.state.policy)), flat(host(learner.state.critic) or [np.zeros(1)])
  met = learner.update(sessions, step=0)
  assert met["update/nonfinite_steps"] == 0 and met["sessions/trained"] == len(sessions)
  assert learner.version == 1
  c1 = flat(host(learner.state.critic) or [np.zeros(1)])
  return flat(host(learner.state.policy)) - p0, c1 - c0, met


@pytest.mark.slow
@pytest.mark.parametrize("shape, estimator, critic", PARITY_CASES)
def test_sharded_update_matches_one_device(spread_sessions, shape, estimator, critic):
  """The update (params after minus before; the critic's too) on each mesh
  equals the one-device update within TOL, and the update is >= 100x TOL.

  The comparison is in norm, per parameter tree: ||update_n - update_1|| <=
  TOL_NORM * ||update_1||. An entry-by-entry maximum is ill-posed after one
  Adam step: where a gradient entry is at fp32 noise level (~1e-9, below
  Adam's eps), lr * g / (|g| + eps) is decided by summation order, and such
  entries differed by 1.9e-5 (1% of the largest update) once the sessions
  changed, while the norm error stays tiny.

  Breaks checked: the sharded update scaled by 1.01 (a 1% error) fails the
  same comparison (asserted below), so a sharding bug of that size would; a
  tolerance looser than 1% of the update fails the ratio assertion.
  """
  c = _parity_config(estimator, critic)
  if (estimator, critic) not in _reference:
    _reference[(estimator, critic)] = _update_on(c, (1, 1, 1), spread_sessions)
  d1_p, d1_c, m1 = _reference[(estimator, critic)]
  dn_p, dn_c, mn = _update_on(c, shape, spread_sessions)
  pairs = [("policy", d1_p, dn_p)] + ([("critic", d1_c, dn_c)] if critic != "none" else [])
  for name, d1, dn in pairs:
    size = np.linalg.norm(d1)
    tol = TOL_NORM * size
    assert size >= 100 * tol and np.abs(d1).max() > 0.5 * c.rl.lr, (name, size)
    err = np.linalg.norm(dn - d1)
    print(f"{shape} {estimator} {name}: |update| {size:.3g}, |error| {err:.3g}, tol {tol:.3g}")
    assert err <= tol, (name, err, tol)
    assert np.linalg.norm(1.01 * dn - d1) > tol  # a 1% error is caught
  np.testing.assert_allclose(m1["total_loss"], mn["total_loss"], rtol=1e-4, atol=1e-6)


def _learner_on(c, mesh):
  rules = get_rules("default")
  policy = create_sharded(lambda: Transformer(MC, rngs=nnx.Rngs(0)), mesh, rules)
  gd, params = nnx.split(policy)
  cgd = cparams = None
  if c.critic.kind == "separate":
    cgd, cparams = nnx.split(create_sharded(lambda: Critic(MC, rngs=nnx.Rngs(1)), mesh, rules))
  return Learner(c, mesh, rules, policy_gd=gd, policy_params=params, critic_gd=cgd, critic_params=cparams,
                 total_updates=3, tokenizer=ByteTokenizer())


def test_env_error_sessions_never_train(sessions):
  c = _config("grpo", "none")
  learner = _learner_on(c, make_mesh((1, 1, 1), devices=jax.devices()[:1]))
  broken = copy.deepcopy(sessions[0])
  broken.finish("env_error", error="boom")
  met = learner.update([broken] + list(sessions[1:]), step=0)
  assert met["sessions/untrainable"] == 1 and met["sessions/trained"] == len(sessions) - 1
