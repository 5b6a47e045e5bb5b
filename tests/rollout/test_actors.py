"""The actor pool with a scripted sampler (no model): versions across turns, env
timeouts, crashed actors replaced, clean stops."""
import threading
import time

import jax.numpy as jnp
import pytest

from rollout_fixtures import (TOK, CountEnv, LoggedDelayed, ResetLog, ScriptedSampler, assert_reset_with_session_ids,
                              rewards_by_session)
from mtrl_jax.rollout.actors import (TIMED_OUT_THREAD, ActorPool, ActorSampler, EnvTimeout, ParamBoard,
                                    TimeoutEnv)
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.staleness_queue import StalenessQueue


class VersionedSampler(ScriptedSampler):
  """The scripted sampler plus the weight-swap call of the real one."""

  def __init__(self, **kw):
    super().__init__(**kw)
    self.params = None

  def set_params(self, params, version):
    self.params, self.version = params, int(version)


class GateEnv(CountEnv):
  """Blocks its step at `gate_turn` until the test opens the gate."""

  def __init__(self, horizon=3, gate_turn=1, gate=None, reached=None):
    super().__init__(horizon=horizon)
    self.gate_turn, self.gate, self.reached = gate_turn, gate, reached

  def _step(self, action):
    if self.turn == self.gate_turn:
      self.reached.set()
      assert self.gate.wait(60)
    return super()._step(action)


class SlowEnv(CountEnv):
  """Its step at turn 1 takes `delay_s` on even seeds."""

  def __init__(self, horizon=3, delay_s=0.0):
    super().__init__(horizon=horizon)
    self.delay_s = delay_s

  def _step(self, action):
    if self.turn == 1 and self.seed % 2 == 0:
      time.sleep(self.delay_s)
    return super()._step(action)


def engine_for(env_factory, group_size=2):
  return RolloutEngine(VersionedSampler(p_stop=0.5), TOK, env_factory, group_size=group_size,
                       turn_token_budget=4, context_cap=96, num_env_threads=2, env_name="count")


def make_pool(engine, *, eta=1, T=2, actors=2, chunk=1, **kw):
  q = StalenessQueue(eta=eta, groups_per_update=T, max_chunk=chunk)
  board = ParamBoard({"w": jnp.zeros(2)}, 0)
  pool = ActorPool(engine, q, board, num_actors=actors, groups_per_chunk=chunk, seed=0, groups_per_update=T,
                   batch_seeds=lambda k: [1000 * k + j for j in range(T)], **kw)
  return q, board, pool


def pool_threads():
  return [t for t in threading.enumerate() if t.name.startswith("mtrl-") and t.is_alive()]


def test_a_session_spans_versions_and_each_token_keeps_its_own():
  gate, reached = threading.Event(), threading.Event()
  engine = engine_for(lambda: GateEnv(horizon=3, gate_turn=1, gate=gate, reached=reached), group_size=1)
  q, board, pool = make_pool(engine, eta=2, T=1, actors=1)
  pool.start()
  try:
    assert reached.wait(60)  # turn 1's action is out; its env step is blocked
    board.publish({"w": jnp.ones(2)}, 1)
    q.publish(1)
    gate.set()
    b = q.get(version=1, timeout=60)
  finally:
    assert pool.stop(5) == []
  (s,) = b.sessions
  assert [t.version.tolist() for t in s.turns] == [[0] * len(s.turns[0].action_ids),
                                                  [0] * len(s.turns[1].action_ids),
                                                  [1] * len(s.turns[2].action_ids)]
  assert b.staleness_b.tolist() == [1]


def test_actor_sampler_pins_the_weights_it_stamps():
  base = VersionedSampler()
  board = ParamBoard("w0", 0)
  view = ActorSampler(base, board, threading.Event())
  board.publish("w1", 4)
  assert base.version == 0  # the shared sampler is never touched
  assert view.version == 4 and view.params == "w1"


def test_env_timeout_ends_only_the_slow_sessions():
  # Margins wide enough for a loaded machine: a fast step must finish within
  # the 1 s limit (it takes microseconds), a slow one takes 3x the limit.
  engine = engine_for(lambda: SlowEnv(horizon=3, delay_s=3.0), group_size=1)
  q, board, pool = make_pool(engine, eta=0, T=4, actors=2, step_timeout_s=1.0)
  pool.start()
  try:
    b = q.get(timeout=60)
  finally:
    assert pool.stop(5) == []
  for s in b.sessions:
    if s.seed % 2 == 0:
      assert s.env_error and s.error.startswith("EnvTimeout"), s.error
      assert s.num_turns == 2  # the timed-out step is recorded as the last turn
    else:
      assert not s.env_error and s.num_turns == 3
  # The abandoned calls finish on their own and their threads end.
  deadline = time.monotonic() + 60
  while any(t.name == TIMED_OUT_THREAD for t in threading.enumerate()) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not pool_threads()


@pytest.mark.parametrize("step_timeout_s", [None, 60.0])
def test_every_reset_gets_its_session_id_and_a_per_session_probe_repeats(step_timeout_s):
  """Two actors play a batch of `delayed` (per-session noise, envs/session_noise.py), with and
  without the per-call time limit (`TimeoutEnv` between the engine and the env): every env reset
  receives its task seed and its own session id, two pools at one seed hand over the same
  sessions, and the two sessions of a group draw different noise.
  Break checked: `TimeoutEnv.reset` calling the env's reset without the session id fails the
  reset log (step_timeout_s=60), and the equality of the two pools on its own."""
  runs = []
  for _ in range(2):
    log = ResetLog()
    q, board, pool = make_pool(engine_for(lambda: LoggedDelayed(log)), eta=0, T=4, actors=2,
                               step_timeout_s=step_timeout_s)
    pool.start()
    try:
      b = q.get(timeout=60)
    finally:
      assert pool.stop(5) == []
    assert len(b.sessions) == 8
    assert_reset_with_session_ids(log, b.sessions)
    runs.append(rewards_by_session(b.sessions))
  assert runs[0] == runs[1]
  assert all(len(r) == 4 for r in runs[0].values())
  ids = sorted(runs[0])
  assert any(runs[0][a] != runs[0][b] for a, b in zip(ids[::2], ids[1::2]))


def test_timeout_env_passes_results_and_errors_through():
  env = TimeoutEnv(CountEnv(horizon=2, fail_turns=(1,)), timeout_s=5)
  assert env.reset(3).observation.startswith("n ")
  env.step("1")
  with pytest.raises(RuntimeError, match="step failed"):
    env.step("1")
  assert issubclass(EnvTimeout, Exception) and env.max_turns == 2


def test_a_crashed_actor_is_replaced_and_its_groups_replayed():
  crashed = set()

  def fault(actor, ticket):
    if ticket.first_group in (1, 4) and ticket.attempt == 0:
      crashed.add(ticket.first_group)
      raise RuntimeError(f"injected crash on ticket {ticket.first_group}")

  engine = engine_for(lambda: CountEnv(horizon=2))
  q, board, pool = make_pool(engine, eta=1, T=2, actors=2, fault_hook=fault)
  pool.start()
  seen = []
  try:
    for v in range(1, 5):
      b = q.get(timeout=60)
      seen += [g.index for g in b.groups]
      for g in b.groups:  # ids are unique across actors and follow the group index
        assert {s.group_id for s in g.sessions} == {g.index}
      board.publish({"w": jnp.full(2, v)}, v)
      q.publish(v)
    deadline = time.monotonic() + 60  # the supervisor polls: give it time to see the second crash
    while pool.restarts < 2 and time.monotonic() < deadline:
      time.sleep(0.01)
  finally:
    assert pool.stop(5) == []
  assert crashed == {1, 4} and pool.restarts == 2 and len(pool.crashes) == 2
  assert len(seen) == len(set(seen)) == 8
  assert 1 in seen  # the crashed ticket was replayed, not lost
  q.assert_invariant()
  assert not pool_threads()


def test_too_many_crashes_close_the_queue_with_the_error():
  def fault(actor, ticket):
    raise RuntimeError("always")

  engine = engine_for(lambda: CountEnv(horizon=2))
  q, board, pool = make_pool(engine, fault_hook=fault, max_restarts=3)
  pool.start()
  with pytest.raises(Exception, match="max_restarts=3"):
    q.get(timeout=60)
  assert pool.stop(5) == []
  assert pool.restarts == 4 and not pool_threads()


def test_stop_while_playing_leaves_no_threads():
  engine = engine_for(lambda: SlowEnv(horizon=3, delay_s=0.05))
  before = set(threading.enumerate())
  q, board, pool = make_pool(engine, eta=2, T=2, actors=3)
  pool.start()
  time.sleep(0.2)  # actors mid-session
  assert pool.stop(5) == []
  # Threads that the pool's threads started (env calls) end just after them:
  # poll rather than sleep a fixed time, which a loaded machine can outrun.
  deadline = time.monotonic() + 30
  while [t for t in set(threading.enumerate()) - before if t.is_alive()] and time.monotonic() < deadline:
    time.sleep(0.02)
  assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
  q.assert_invariant()
