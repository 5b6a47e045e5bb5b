"""The engine with the real jitted sampler and a random tiny policy, on the built-in envs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.envs import registry
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer, token_logprobs
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.packing import pack_sessions
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
registry.names()  # load the built-ins on the main thread before env threads call make()


@pytest.fixture(scope="module")
def policy():
  return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(policy):
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=[TOK.eos_id], log_compiles=False, version=3)


def _engine(sampler, env, group_size=2, **kw):
  # One batch size and capacity for every test here, so they share compiled programs.
  kw = {"turn_token_budget": 8, "context_cap": 256, "num_env_threads": 4, **kw}
  return RolloutEngine(sampler, TOK, functools.partial(registry.make, env), group_size=group_size,
                       env_name=env, **kw)


@pytest.mark.parametrize("env", ["keydoor", "memory", "repair"])
def test_plays_each_builtin_env(policy, sampler, env):
  result = _engine(sampler, env).run([1, 2], jax.random.key(0))
  sessions = result.sessions
  assert len(sessions) == 4
  result.ledger.check(sessions)
  max_turns = registry.make(env).max_turns
  for s in sessions:
    assert s.env_name == env and s.done and not s.env_error and s.num_turns >= 1
    assert s.num_turns <= max_turns
    assert s.terminated or s.truncated or s.context_cap
    assert s.truncated == (not s.terminated and not s.context_cap and s.num_turns == max_turns)
    assert len(s.flat_tokens()) <= 256 and s.min_version() == 3
    for t in s.turns:
      assert 1 <= len(t.action_ids) <= 8
      assert t.cut_at_budget == (t.action_ids[-1] != TOK.eos_id)
  # The recorded behaviour log-probs are the model's log-probs of the recorded
  # tokens in the packed layout: cache order, shift and masks all line up.
  batch = pack_sessions([s for s in sessions if s.trainable])
  logits, _ = policy(jnp.asarray(batch.tokens_bt))
  logp_bt = np.asarray(token_logprobs(logits, jnp.asarray(batch.targets_bt)))
  m = batch.loss_mask_bt == 1
  assert m.sum() == sum(s.num_action_tokens for s in sessions)
  np.testing.assert_allclose(logp_bt[m], batch.behav_logp_bt[m], atol=2e-4)


def test_same_seed_same_sessions_with_the_real_sampler(sampler):
  params = SamplingParams(temperature=0.8)
  runs = [_engine(sampler, "memory", sampling=params).run([5, 6], jax.random.key(7)).sessions for _ in range(2)]
  assert [s.to_dict() for s in runs[0]] == [s.to_dict() for s in runs[1]]


def test_faulty_wrapper_gives_env_errors_and_the_batch_finishes(sampler):
  factory = lambda: registry.make("memory", wrappers=[{"name": "faulty", "rate": 0.2}])
  engine = RolloutEngine(sampler, TOK, factory, group_size=2, turn_token_budget=8, context_cap=256,
                         num_env_threads=4)
  result = engine.run([3, 4], jax.random.key(1))
  errors = [s for s in result.sessions if s.env_error]
  assert 0 < len(errors) < len(result.sessions)
  assert all(s.done for s in result.sessions)
  assert all(not s.trainable and s.turns[-1].env_error for s in errors)
  result.ledger.check(result.sessions)
  pack_sessions([s for s in result.sessions if s.trainable], layout="turn")
