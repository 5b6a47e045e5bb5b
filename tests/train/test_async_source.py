"""AsyncSource end to end: the metrics and shutdown paths with a scripted sampler,
then with a tiny real policy and learner: eta = 0 reproduces the synchronous
trainer exactly (one actor, or several finishing out of order), decoupled and
naive PPO agree there, and the reported staleness is the one on the tokens."""
import copy
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from rollout_fixtures import TOK, CountEnv, ScriptedSampler  # noqa: E402

from mtrl_jax.envs import registry  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.rollout.staleness_queue import StalenessQueue  # noqa: E402
from mtrl_jax.train.async_source import ActorPoolError, AsyncSource, copy_params  # noqa: E402
from mtrl_jax.train.source import SyncSource  # noqa: E402
from tiny_world import G, T, flat, host, learner, world  # noqa: E402

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


def test_shutdown_is_clean_on_a_learner_error():
  before = set(threading.enumerate())
  src = scripted_source(eta=1, actors=3)
  with pytest.raises(FloatingPointError):
    with src:
      src.next_batch(0)
      src.publish({"w": jnp.ones(3)}, 1)
      raise FloatingPointError("the learner failed")
  assert not new_threads(before)


@pytest.fixture
def default_sigint():
  """Python's own SIGINT handler for the test (what a user's shell gives the main job)."""
  old = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, old)


def _interrupt_inside_the_get_wait(monkeypatch):
  """Sends a real SIGINT the first time the main thread waits inside `StalenessQueue.get`
  after the first batch. Deterministic: the signal is raised by the main thread itself
  at that point (no timer race), and Python runs the handler right there."""
  real_wait, main, sent = StalenessQueue._wait, threading.main_thread(), []

  def wait(self, deadline, what):
    if what == "get" and threading.current_thread() is main and self._batches >= 1 and not sent:
      sent.append(time.monotonic())
      signal.raise_signal(signal.SIGINT)
    return real_wait(self, deadline, what)

  monkeypatch.setattr(StalenessQueue, "_wait", wait)
  return sent


def test_ctrl_c_inside_next_batch_wait_stops_the_actors_and_raises(monkeypatch, default_sigint):
  """A Ctrl-C while the learner waits for sessions: KeyboardInterrupt out of that
  `next_batch`, the actors stopped, no thread left behind.

  The interrupt is delivered at a known point (inside the queue's wait, see
  `_interrupt_inside_the_get_wait`): the old version of this test used a
  0.05 s timer and `_thread.interrupt_main`, which raises wherever the main
  thread happens to be, including inside library code that swallows it.
  """
  before = set(threading.enumerate())
  sent = _interrupt_inside_the_get_wait(monkeypatch)
  src = scripted_source(eta=0, actors=3)  # eta 0: the second batch must be waited for
  with pytest.raises(KeyboardInterrupt):
    with src:
      src.next_batch(0)
      src.publish({"w": jnp.ones(3)}, 1)
      src.next_batch(1)
  assert sent, "the interrupt was never delivered"
  assert src.queue.closed  # the latch closed the queue: no actor may admit a new ticket
  assert not new_threads(before)
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored on close


def test_a_swallowed_ctrl_c_is_raised_again_by_the_next_call(default_sigint):
  """Library code that swallows the KeyboardInterrupt (JAX has bare `except:`
  clauses on its tracing path) must not cost the user their Ctrl-C: the
  next `publish` or `next_batch` raises it again, and the actors have already
  stopped.

  Breaks checked: the old `AsyncSource` (no latch, Python's default handler)
  plays all the batches below and the test fails with "never raised"; with
  the latch installed but `self.ctrl_c.check()` removed from `publish` and
  `next_batch`, the next call raises QueueClosed instead of KeyboardInterrupt.
  """
  before = set(threading.enumerate())
  src = scripted_source(eta=1, actors=3)
  raised_at = None
  with src:
    src.next_batch(0)
    src.publish({"w": jnp.ones(3)}, 1)
    try:  # a library call that eats every exception, interrupted by a Ctrl-C
      signal.raise_signal(signal.SIGINT)
    except BaseException:  # noqa: BLE001 - the swallowing this test is about
      pass
    for step in range(1, 6):
      try:
        src.next_batch(step)
        src.publish({"w": jnp.ones(3)}, step + 1)
      except KeyboardInterrupt:
        raised_at = step
        break
  assert raised_at == 1, "the swallowed Ctrl-C was never raised again"
  assert not new_threads(before)


# ---------------------------------------------------------- tiny real policy
def same_sessions(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert (x.session_id, x.group_id, x.seed, x.end_reason) == (y.session_id, y.group_id, y.seed, y.end_reason)
    np.testing.assert_array_equal(x.flat_tokens(), y.flat_tokens())
    np.testing.assert_array_equal(x.flat_version(), y.flat_version())
    np.testing.assert_allclose(x.flat_logp(), y.flat_logp(), atol=1e-6)
    assert x.episode_return == y.episode_return


def token_staleness(version, sessions):
  """Learner version minus the oldest version recorded on each session's tokens."""
  return np.asarray([version - s.flat_version()[s.loss_mask() > 0].min() for s in sessions])


def test_eta0_is_the_synchronous_trainer_and_decoupled_equals_naive():
  _, _, _, params, sampler, engine = world()
  steps = 2
  # Synchronous reference: SyncSource + decoupled learner.
  ref = learner()
  sync = SyncSource(copy.copy(engine), seed=0, tasks_per_update=T)
  sync.engine.next_group_id = sync.engine.next_session_id = 0
  sync_batches, sync_metrics = [], []
  for step in range(steps):
    sampler.set_params(copy_params(ref.policy_params_for_sampler()), ref.version)
    sessions, info = sync.next_batch(step)
    assert info["staleness/max"] == token_staleness(ref.version, sessions).max()
    sync_batches.append(sessions)
    sync_metrics.append(ref.update(sessions, step))
  p_sync = flat(host(ref.state.policy))

  # The async source at eta = 0, one actor playing whole batches: same sessions, same update.
  lrn = learner()
  async_batches = []
  with AsyncSource(engine, params=params, version=0, seed=0, tasks_per_update=T, eta=0, actors=1,
                   groups_per_chunk=T) as src:
    for step in range(steps):
      src.publish(lrn.policy_params_for_sampler(), lrn.version)
      sessions, info = src.next_batch(step)
      assert info["staleness/max"] == token_staleness(lrn.version, sessions).max()
      assert info["staleness/hist_0"] == T * G
      async_batches.append(sessions)
      met = lrn.update(sessions, step)
      # On-policy: behaviour and proximal log-probs agree up to numerics.
      assert abs(met["update/ratio_prox_behav_max"] - 1.0) < 1e-4
      assert met["total_loss"] == pytest.approx(sync_metrics[step]["total_loss"], rel=1e-5, abs=1e-7)
  for a, b in zip(async_batches, sync_batches):
    same_sessions(a, b)
  p_async = flat(host(lrn.state.policy))
  np.testing.assert_allclose(p_async, p_sync, atol=1e-6)

  # Naive PPO (behaviour log-probs as pi_old) on the same sessions: the same update.
  naive = learner(decoupled=False)
  p0 = flat(host(naive.state.policy))
  for step, sessions in enumerate(async_batches):
    met = naive.update(sessions, step)
    assert met["total_loss"] == pytest.approx(sync_metrics[step]["total_loss"], rel=1e-4, abs=1e-6)
  p_naive = flat(host(naive.state.policy))
  assert np.linalg.norm(p_async - p0) > 1e-3  # the updates did move the policy
  assert np.linalg.norm(p_naive - p_async) < 1e-3 * np.linalg.norm(p_async - p0)


def test_eta0_with_several_actors_finishing_out_of_order_gives_the_synchronous_update(monkeypatch):
  """Three actors, one group per ticket; group 0 is held back until group 1 is
  in the queue, so the groups arrive in the order [1, 0]. The source must hand
  them over in canonical order (group, session id): the sessions and the
  update (2 minibatches, so row order decides what each Adam step sees) equal
  those of one actor playing the same tickets in order.

  Break checked: `sessions = batch.sessions` (completion order) in
  `AsyncSource.next_batch`: the session comparison fails (and the update
  would, as the completion-order control at the end shows).
  """
  _, _, _, params, _, engine = world()
  order, group1_in = [], threading.Event()
  real_put = StalenessQueue.put

  def put(self, ticket, groups, metas=None, timeout=None):
    order.append(ticket.first_group)
    real_put(self, ticket, groups, metas, timeout)
    if ticket.first_group == 1:
      group1_in.set()

  def hold_group0(actor, ticket):
    if ticket.first_group == 0 and ticket.attempt == 0 and not group1_in.is_set():
      assert group1_in.wait(60)

  monkeypatch.setattr(StalenessQueue, "put", put)

  def play(actors, hook):
    order.clear()
    group1_in.clear()
    with AsyncSource(engine, params=params, version=0, seed=0, tasks_per_update=T, eta=0, actors=actors,
                     groups_per_chunk=1, fault_hook=hook) as src:
      src.publish(params, 0)
      sessions, info = src.next_batch(0)
    return sessions, list(order)

  ref_sessions, ref_order = play(1, None)
  assert ref_order == [0, 1]
  sessions, got_order = play(3, hold_group0)
  assert got_order == [1, 0]  # really out of order
  same_sessions(sessions, ref_sessions)

  def update(batch):
    lrn = learner(minibatches=2)
    p0 = flat(host(lrn.state.policy))
    lrn.update(batch, 0)
    return p0, flat(host(lrn.state.policy))

  p0, p_ref = update(ref_sessions)
  _, p_multi = update(sessions)
  step_size = np.linalg.norm(p_ref - p0)
  assert step_size > 1e-2
  np.testing.assert_allclose(p_multi, p_ref, atol=1e-6)
  # The control: the same sessions in completion order give a different update.
  _, p_completion = update([s for g in (1, 0) for s in sessions if s.group_id == g])
  assert np.linalg.norm(p_completion - p_ref) > 0.05 * step_size


def test_reported_staleness_is_the_one_recorded_on_the_tokens():
  """eta = 2, two actors running ahead: each batch's `staleness/max` and
  `staleness/mean` equal the learner version minus the oldest version on each
  session's tokens, and so does the learner's own `update/staleness_max`.

  Break checked: `AsyncSource.next_batch` reporting 0 whatever the queue
  measured (`st = 0 * batch.staleness_b`, the old hard-coded-0 check would
  pass): fails at the first stale batch.
  """
  _, _, _, params, _, engine = world()
  lrn = learner()
  seen = []
  with AsyncSource(engine, params=params, version=0, seed=1, tasks_per_update=T, eta=2, actors=2) as src:
    for step in range(4):
      src.publish(lrn.policy_params_for_sampler(), lrn.version)
      sessions, info = src.next_batch(step)
      st = token_staleness(lrn.version, sessions)
      assert info["staleness/max"] == st.max() and info["staleness/mean"] == pytest.approx(st.mean())
      assert sum(info[f"staleness/hist_{k}"] for k in range(3)) == len(sessions)
      assert all(info[f"staleness/hist_{k}"] == np.sum(st == k) for k in range(3))
      met = lrn.update(sessions, step)
      assert met["update/staleness_max"] == st.max() and met["update/nonfinite_steps"] == 0
      seen.append(st.max())
  assert lrn.version == 4
  assert max(seen) > 0  # the actors ran ahead: these comparisons are not all 0 == 0


def test_host_shares_together_play_the_one_host_batch():
  """Two "hosts", each with its share (one of T=2 groups): the sync source and
  the async one (eta = 0, two actors, started at update 3) play only that
  share, and the shares together are the one-host batch of update 3, token
  for token, with the same group and session ids.

  Break checked: the actor pool keying a group by the host's local group
  number instead of its place in the update (the async share then samples
  host 0's tokens for host 1's task: fails).
  """
  from mtrl_jax.rollout.ownership import host_share
  _, _, _, params, sampler, engine = world()
  sampler.set_params(copy_params(params), 0)  # the shared world's sampler may hold later weights
  whole, _ = SyncSource(copy.copy(engine), seed=0, tasks_per_update=T).next_batch(3)
  parts = [SyncSource(copy.copy(engine), seed=0, tasks_per_update=T, share=host_share(T, p, 2)).next_batch(3)[0]
           for p in range(2)]
  assert {s.group_id for s in parts[0]}.isdisjoint({s.group_id for s in parts[1]})
  same_sessions(sorted(parts[0] + parts[1], key=lambda s: (s.group_id, s.session_id)), whole)
  assert {s.group_id for s in whole} == {3 * T, 3 * T + 1}
  with AsyncSource(engine, params=params, version=0, seed=0, tasks_per_update=T, eta=0, actors=2,
                   start_step=3, share=host_share(T, 1, 2)) as src:
    src.publish(params, 0)
    got, _ = src.next_batch(3)
  same_sessions(got, parts[1])
