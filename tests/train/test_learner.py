"""The RL learner: one update is the same on every mesh, and estimators plug in by name."""
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


def _config(estimator, critic):
  c = shrink(default_config())
  c.critic.kind = critic
  c.rl.estimator = estimator
  c.rl.minibatches = 2
  return c


@pytest.mark.slow
@pytest.mark.parametrize("estimator, critic", [("ms_grpo", "none"), ("gae", "separate")])
def test_update_is_the_same_on_one_device_and_on_a_2x2x2_mesh(sessions, estimator, critic):
  c = _config(estimator, critic)
  outs = []
  for mesh in (make_mesh((1, 1, 1), devices=jax.devices()[:1]), make_mesh((2, 2, 2))):
    learner = _learner_on(c, mesh)
    met = learner.update(sessions, step=0)
    assert met["update/nonfinite_steps"] == 0 and met["sessions/trained"] == len(sessions)
    outs.append((jax.device_get(learner.state.policy), met))
  (p1, m1), (p8, m8) = outs
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
  np.testing.assert_allclose(m1["total_loss"], m8["total_loss"], rtol=1e-4, atol=1e-6)
  assert learner.version == 1


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
