"""AsyncSource end to end: the metrics and shutdown paths with a scripted sampler,
then with a tiny real policy and learner: eta = 0 reproduces the synchronous
trainer exactly, decoupled and naive PPO agree there, and both run on stale data."""
import copy
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from rollout_fixtures import TOK, CountEnv, ScriptedSampler  # noqa: E402

from mtrl_jax.config import base_config  # noqa: E402
from mtrl_jax.envs import registry  # noqa: E402
from mtrl_jax.envs.base import Env, Reset, Step  # noqa: E402
from mtrl_jax.models.config import ModelConfig  # noqa: E402
from mtrl_jax.models.transformer import Transformer  # noqa: E402
from mtrl_jax.parallel.mesh import mesh_from_config  # noqa: E402
from mtrl_jax.parallel.rules import rules_from_config  # noqa: E402
from mtrl_jax.parallel.sharded_init import create_sharded  # noqa: E402
from mtrl_jax.parallel.sharded_step import init_opt_state  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.sampling.sampler import Sampler  # noqa: E402
from mtrl_jax.train.async_source import ActorPoolError, AsyncSource, copy_params  # noqa: E402
from mtrl_jax.train.learner import Learner  # noqa: E402
from mtrl_jax.train.rl_step import LearnerState  # noqa: E402
from mtrl_jax.train.source import SyncSource  # noqa: E402

registry.names()  # built-ins loaded on the main thread before env threads call make()


class VersionedSampler(ScriptedSampler):
  def __init__(self, **kw):
    super().__init__(**kw)
    self.params = None

  def set_params(self, params, version):
    self.params, self.version = params, int(version)


def scripted_source(**kw):
  engine = RolloutEngine(VersionedSampler(p_stop=0.5), TOK, lambda: CountEnv(horizon=2), group_size=2,
                         turn_token_budget=4, context_cap=96, num_env_threads=2, env_name="count")
  args = dict(params={"w": jnp.zeros(3)}, version=0, seed=0, tasks_per_update=2, eta=1, actors=2)
  args.update(kw)
  return AsyncSource(engine, **args)


def new_threads(before):
  return [t for t in set(threading.enumerate()) - before if t.is_alive()]


# ------------------------------------------------------------ no model needed
def test_next_batch_reports_the_sync_keys_and_the_async_ones():
  before = set(threading.enumerate())
  src = scripted_source(eta=2)
  try:
    for step in range(3):
      src.publish({"w": jnp.full(3, step)}, step)
      sessions, info = src.next_batch(step)
      assert len(sessions) == 4 and len({s.group_id for s in sessions}) == 2
  finally:
    assert src.close() == []
  for key in ("rollout/success", "rollout/return", "rollout/env_errors", "rollout/rounds", "time/rollout_s",
              "time/generate_s", "time/env_s", "time/prefill_s", "ledger/tokens_generated", "ledger/sessions",
              "staleness/mean", "staleness/max", "staleness/hist_0", "staleness/hist_2", "queue/depth",
              "queue/dropped_total", "actors/utilisation", "actors/restarts", "learner/idle_s"):
    assert key in info, key
  assert sum(info[f"staleness/hist_{k}"] for k in range(3)) == 4
  assert 0.0 <= info["actors/utilisation"] <= 1.0
  assert info["ledger/sessions"] == 4
  assert not new_threads(before)


def test_forgetting_to_publish_is_an_error_not_a_hang():
  src = scripted_source(eta=0)
  try:
    src.next_batch(0)
    with pytest.raises(RuntimeError, match="publish"):
      src.next_batch(1)
  finally:
    src.close()


def test_actor_crashes_beyond_the_limit_surface_in_next_batch():
  def fault(actor, ticket):
    raise ValueError("bug in actor code")

  before = set(threading.enumerate())
  src = scripted_source(fault_hook=fault, max_restarts=2)
  with pytest.raises(ActorPoolError, match="max_restarts=2"):
    src.next_batch(0)
  assert src.close() == [] and not new_threads(before)


@pytest.mark.parametrize("how", ["learner_error", "ctrl_c"])
def test_shutdown_is_clean_on_a_learner_error_or_ctrl_c(how):
  before = set(threading.enumerate())
  src = scripted_source(eta=1, actors=3)
  with pytest.raises(KeyboardInterrupt if how == "ctrl_c" else FloatingPointError):
    with src:
      src.next_batch(0)
      src.publish({"w": jnp.ones(3)}, 1)
      if how == "ctrl_c":
        # A real Ctrl-C lands while the main thread waits inside next_batch.
        import _thread
        threading.Timer(0.05, _thread.interrupt_main).start()
        for step in range(1, 10_000):
          src.next_batch(step)
          src.publish({"w": jnp.ones(3)}, step + 1)
      raise FloatingPointError("the learner failed")
  time.sleep(0.1)  # the Timer thread itself
  assert not [t for t in new_threads(before) if t.name.startswith("mtrl-")]
  assert not new_threads(before)


# ---------------------------------------------------------- tiny real policy
T, G = 2, 4


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


def tiny_config(decoupled: bool):
  c = base_config()
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = "none"
  c.env.kwargs.length = 1
  c.rl.update(estimator="ms_grpo", tasks_per_update=T, group_size=G, minibatches=1, epochs=1, lr=1e-2,
              decoupled=decoupled, warmup_steps=0)
  c.rollout.update(turn_budget=4, context_cap=128)
  return c


@pytest.fixture(scope="module")
def world():
  c = tiny_config(True)
  mesh = mesh_from_config(c.mesh, devices=jax.devices()[:1])  # one device: fast compiles
  rules = rules_from_config(c.mesh)
  policy = create_sharded(lambda: Transformer(ModelConfig.from_dict(c.model), rngs=nnx.Rngs(0)), mesh, rules)
  gd, params = nnx.split(policy)
  learners = {d: Learner(tiny_config(d), mesh, rules, policy_gd=gd, policy_params=copy_params(params),
                         total_updates=8, tokenizer=TOK) for d in (True, False)}
  sampler = Sampler(gd, copy_params(params), pad_id=TOK.pad_id, stop_ids=(TOK.eos_id,), log_compiles=False)
  engine = RolloutEngine(sampler, TOK, SpreadEnv, group_size=G, turn_token_budget=4, context_cap=128,
                         num_env_threads=2, env_name="spread")
  return dict(params=params, learners=learners, sampler=sampler, engine=engine)


def reset(learner, params):
  p = copy_params(params)
  learner.state = LearnerState(p, init_opt_state(learner.tx_policy, p, learner.state_sh.opt_policy), {}, {})
  learner.version = 0
  return learner


def flat_params(learner):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(learner.state.policy)])


def same_sessions(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert (x.session_id, x.group_id, x.seed, x.end_reason) == (y.session_id, y.group_id, y.seed, y.end_reason)
    np.testing.assert_array_equal(x.flat_tokens(), y.flat_tokens())
    np.testing.assert_array_equal(x.flat_version(), y.flat_version())
    np.testing.assert_allclose(x.flat_logp(), y.flat_logp(), atol=1e-6)
    assert x.episode_return == y.episode_return


def test_eta0_is_the_synchronous_trainer_and_decoupled_equals_naive(world):
  params, sampler, engine = world["params"], world["sampler"], world["engine"]
  steps = 2
  # Synchronous reference: SyncSource + decoupled learner.
  ref = reset(world["learners"][True], params)
  sync = SyncSource(copy.copy(engine), seed=0, tasks_per_update=T)
  sync.engine.next_group_id = sync.engine.next_session_id = 0
  sync_batches, sync_metrics = [], []
  for step in range(steps):
    sampler.set_params(copy_params(ref.policy_params_for_sampler()), ref.version)
    sessions, _ = sync.next_batch(step)
    sync_batches.append(sessions)
    sync_metrics.append(ref.update(sessions, step))
  p_sync = flat_params(ref)

  # The async source at eta = 0, one actor playing whole batches: same sessions, same update.
  learner = reset(world["learners"][True], params)
  async_batches = []
  with AsyncSource(engine, params=params, version=0, seed=0, tasks_per_update=T, eta=0, actors=1,
                   groups_per_chunk=T) as src:
    for step in range(steps):
      src.publish(learner.policy_params_for_sampler(), learner.version)
      sessions, info = src.next_batch(step)
      assert info["staleness/max"] == 0 and info["staleness/hist_0"] == T * G
      async_batches.append(sessions)
      met = learner.update(sessions, step)
      # On-policy: behaviour and proximal log-probs agree up to numerics.
      assert abs(met["update/ratio_prox_behav_max"] - 1.0) < 1e-4
      assert met["total_loss"] == pytest.approx(sync_metrics[step]["total_loss"], rel=1e-5, abs=1e-7)
  for a, b in zip(async_batches, sync_batches):
    same_sessions(a, b)
  p_async = flat_params(learner)
  np.testing.assert_allclose(p_async, p_sync, atol=1e-6)

  # Naive PPO (behaviour log-probs as pi_old) on the same sessions: the same update.
  naive = reset(world["learners"][False], params)
  p0 = flat_params(naive)
  for step, sessions in enumerate(async_batches):
    met = naive.update(sessions, step)
    assert met["total_loss"] == pytest.approx(sync_metrics[step]["total_loss"], rel=1e-4, abs=1e-6)
  p_naive = flat_params(naive)
  assert np.linalg.norm(p_async - p0) > 1e-3  # the updates did move the policy
  assert np.linalg.norm(p_naive - p_async) < 1e-3 * np.linalg.norm(p_async - p0)


def test_stale_data_trains_with_both_decoupled_and_naive_ppo(world):
  params, engine = world["params"], world["engine"]
  dec, naive = reset(world["learners"][True], params), reset(world["learners"][False], params)
  seen_stale = 0
  with AsyncSource(engine, params=params, version=0, seed=1, tasks_per_update=T, eta=2, actors=2) as src:
    for step in range(4):
      src.publish(dec.policy_params_for_sampler(), dec.version)
      sessions, info = src.next_batch(step)
      assert info["staleness/max"] <= 2
      assert all(dec.version - s.min_version() <= 2 for s in sessions)
      seen_stale += sum(dec.version - s.min_version() > 0 for s in sessions)
      for learner in (dec, naive):
        met = learner.update(sessions, step)
        assert np.isfinite(met["total_loss"]) and met["update/nonfinite_steps"] == 0
  assert dec.version == naive.version == 4
  assert seen_stale > 0  # the actors ran ahead: these updates really were off-policy
