"""A tiny real policy, env and learner for the learner tests (imported by name;
tests/train is on sys.path under pytest's default import mode).

Everything is built on one CPU device (fast compiles). `learner(**rl)` caches
one `Learner` per config so its jitted step compiles once per test session;
`reset` puts a learner back at the initial weights, version 0, fresh Adam.
"""
import functools

import jax
import numpy as np
from flax import nnx

from mtrl_jax.config import base_config
from mtrl_jax.envs import registry
from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic, PolicyWithValueHead
from mtrl_jax.parallel.mesh import mesh_from_config
from mtrl_jax.parallel.rules import rules_from_config
from mtrl_jax.parallel.sharded_init import create_sharded
from mtrl_jax.parallel.sharded_step import init_opt_state
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler
from mtrl_jax.train.async_source import copy_params
from mtrl_jax.train.learner import Learner
from mtrl_jax.train.rl_step import LearnerState

registry.names()  # built-ins loaded on the main thread before env threads call make()
TOK = ByteTokenizer()
T, G = 2, 4  # tasks per update, sessions per task


class SpreadEnv(Env):
  """Rewards the action's length mod 3: even a random policy gets spread returns,
  so group-relative advantages (and the updates) are not zero."""

  def __init__(self):
    self.max_turns = 2

  def _reset(self, seed):
    return Reset("spread", f"go {seed % 10}")

  def _step(self, action):
    return Step("go", float(len(action) % 3), False, False, {})

  def expert_action(self):
    return "ab"

  def random_action(self, rng):
    return "a" * rng.randrange(3)


def tiny_config(critic="none", **rl):
  c = base_config()
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = critic
  c.env.kwargs.length = 1
  c.rl.update(estimator="ms_grpo", tasks_per_update=T, group_size=G, minibatches=1, epochs=1, lr=1e-2,
              decoupled=True, warmup_steps=0)
  c.rl.update(rl)
  c.rollout.update(turn_budget=4, context_cap=128)
  return c


@functools.lru_cache(maxsize=None)
def world():
  """(mesh, rules, policy graphdef, initial params, sampler, engine); built once."""
  c = tiny_config()
  mesh = mesh_from_config(c.mesh, devices=jax.devices()[:1])
  rules = rules_from_config(c.mesh)
  policy = create_sharded(lambda: Transformer(ModelConfig.from_dict(c.model), rngs=nnx.Rngs(0)), mesh, rules)
  gd, params = nnx.split(policy)
  sampler = Sampler(gd, copy_params(params), pad_id=TOK.pad_id, stop_ids=(TOK.eos_id,), log_compiles=False)
  engine = RolloutEngine(sampler, TOK, SpreadEnv, group_size=G, turn_token_budget=4, context_cap=128,
                         num_env_threads=2, env_name="spread")
  return mesh, rules, gd, params, sampler, engine


@functools.lru_cache(maxsize=None)
def _learner(critic: str, rl_items: tuple) -> Learner:
  mesh, rules, gd, params, _, _ = world()
  c = tiny_config(critic, **dict(rl_items))
  mc = ModelConfig.from_dict(c.model)
  kw = {}
  if critic == "head":
    model = PolicyWithValueHead(mc, rngs=nnx.Rngs(1), policy=nnx.merge(gd, copy_params(params)))
    gd_h, params_h = nnx.split(model)
    kw = dict(policy_gd=gd_h, policy_params=params_h)
  else:
    kw = dict(policy_gd=gd, policy_params=copy_params(params))
  if critic == "separate":
    cgd, cparams = nnx.split(create_sharded(lambda: Critic(mc, rngs=nnx.Rngs(2)), mesh, rules))
    kw.update(critic_gd=cgd, critic_params=cparams)
  lrn = Learner(c, mesh, rules, total_updates=8, tokenizer=TOK, **kw)
  lrn.initial = (copy_params(lrn.state.policy), copy_params(lrn.state.critic) if lrn.state.critic else {})
  return lrn


def learner(critic="none", **rl) -> Learner:
  """A learner at the initial weights (cached per config: one compile each)."""
  return reset(_learner(critic, tuple(sorted(rl.items()))))


def reset(lrn: Learner) -> Learner:
  p, c = (copy_params(x) if x else {} for x in lrn.initial)
  sh = lrn.state_sh
  lrn.state = LearnerState(p, init_opt_state(lrn.tx_policy, p, sh.opt_policy), c,
                           init_opt_state(lrn.tx_critic, c, sh.opt_critic) if c else {})
  lrn.version = 0
  lrn.nonfinite_in_a_row = lrn.nonfinite_total = 0
  return lrn


@functools.lru_cache(maxsize=None)
def sessions_v0(seed: int = 0):
  """T x G finished sessions sampled by the initial policy (version 0)."""
  _, _, _, params, sampler, engine = world()
  sampler.set_params(copy_params(params), 0)
  engine.next_group_id = engine.next_session_id = 0
  return tuple(engine.run([100 + seed + j for j in range(T)], jax.random.key(seed)).sessions)


def host(tree):
  """A host (numpy) copy of a pytree, safe from the learner's buffer donation."""
  return jax.tree.map(lambda x: np.array(x), jax.device_get(tree))


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(x).astype(np.float64) for x in leaves(tree)])


def trees_equal(a, b) -> bool:
  """Bit-identical leaves (NaN only equal to NaN)."""
  la, lb = leaves(a), leaves(b)
  return len(la) == len(lb) and all(x.shape == y.shape and np.array_equal(x, y, equal_nan=True)
                                    for x, y in zip(la, lb))
