"""Engine bookkeeping against a scripted host sampler (fast, no model)."""
import jax
import pytest

from mtrl_jax.envs.registry import make, names
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import SamplingParams
from rollout_fixtures import (TOK, CountEnv, LoggedDelayed, ResetLog, ScriptedSampler, assert_reset_with_session_ids,
                              rewards_by_session)

SEEDS = [11, 12, 13, 14]
# Load the built-in registry on this thread: the first `make` from several env
# threads at once can see a half-filled registry (reported to the envs owner).
names()


def _engine(sampler=None, factory=lambda: CountEnv(horizon=4), **kw):
  kw = {"group_size": 2, "turn_token_budget": 3, "context_cap": 256, "num_env_threads": 3, **kw}
  return RolloutEngine(sampler or ScriptedSampler(), TOK, factory, sampling=SamplingParams(), **kw)


def _check_consistent(result, sampler, seeds, group_size):
  sessions = result.sessions
  assert len(sessions) == len(seeds) * group_size
  result.ledger.check(sessions)
  assert result.ledger.sessions == len(sessions)
  for r, s in enumerate(sessions):
    assert s.done
    assert s.seed == seeds[r // group_size] and s.group_id == sessions[r - r % group_size].group_id
    # The cache row holds exactly the session's tokens, in the recorded layout.
    assert list(sampler.last_state["rows"][r]) == s.flat_tokens().tolist()
    if s.turns:
      assert s.turns[0].obs_ids.tolist() == TOK.observation_ids(s.turns[0].observation, s.prompt)
    for t in s.turns:
      stopped = len(t.action_ids) and t.action_ids[-1] == TOK.eos_id
      assert t.cut_at_budget == (not stopped)
      assert t.action == TOK.decode(t.action_ids[:-1] if stopped else t.action_ids)
    if not s.env_error and s.turns:
      # The env saw exactly the recorded action texts: replaying them reproduces the observations.
      env = CountEnv(horizon=4)
      obs = env.reset(s.seed).observation
      for t in s.turns:
        assert t.observation == obs
        step = env.step(t.action)
        assert step.reward == t.reward and step.info["invalid_action"] == t.invalid_action
        obs = step.observation
  assert result.timing.total_s >= result.timing.generate_s


def test_groups_cache_and_ledger_agree():
  sampler = ScriptedSampler()
  result = _engine(sampler).run(SEEDS, jax.random.key(0))
  _check_consistent(result, sampler, SEEDS, 2)
  assert all(s.truncated and s.num_turns == 4 for s in result.sessions)
  # Sessions of a group start alike (same seed) but sample differently.
  a, b = result.sessions[0], result.sessions[1]
  assert a.turns[0].observation == b.turns[0].observation
  assert any(x.flat_tokens().tolist() != y.flat_tokens().tolist()
             for x, y in zip(result.sessions[::2], result.sessions[1::2]))


def test_same_seed_same_sessions():
  runs = [_engine().run(SEEDS, jax.random.key(3)).sessions for _ in range(2)]
  assert [s.to_dict() for s in runs[0]] == [s.to_dict() for s in runs[1]]
  other = _engine().run(SEEDS, jax.random.key(4)).sessions
  assert [s.to_dict() for s in runs[0]] != [s.to_dict() for s in other]


def test_every_reset_gets_its_session_id_and_a_per_session_probe_repeats():
  """`delayed` draws its noise and payoff from (task seed, session id) (envs/session_noise.py):
  every env reset receives its session's seed and id, two runs at one key give the same rewards,
  and the two sessions of a group (one seed) draw different noise.
  Break checked: `env.reset(s.seed)` in the engine (the session id dropped: the probe then draws
  from the operating system) fails the reset log and the equality of the two runs; passing the
  group id for the session id fails the reset log and the last check."""
  runs = []
  for _ in range(2):
    log = ResetLog()
    sessions = _engine(factory=lambda: LoggedDelayed(log)).run(SEEDS, jax.random.key(3)).sessions
    assert_reset_with_session_ids(log, sessions)
    runs.append(rewards_by_session(sessions))
  assert runs[0] == runs[1]
  assert all(len(r) == 4 for r in runs[0].values())  # 4 turns each: 3 noise draws and a payoff
  ids = sorted(runs[0])
  assert any(runs[0][a] != runs[0][b] for a, b in zip(ids[::2], ids[1::2]))


def test_ids_stay_unique_across_runs_and_version_is_stamped():
  sampler = ScriptedSampler(version=7)
  engine = _engine(sampler)
  first = engine.run(SEEDS[:2], jax.random.key(0)).sessions
  sampler.version = 8
  second = engine.run(SEEDS[:2], jax.random.key(0)).sessions
  ids = [s.session_id for s in first + second]
  assert len(set(ids)) == len(ids)
  assert {s.group_id for s in first}.isdisjoint({s.group_id for s in second})
  assert {s.min_version() for s in first} == {7} and {s.max_version() for s in second} == {8}


def test_budget_cut_turns_still_reach_the_env():
  sampler = ScriptedSampler(p_stop=0.0)
  result = _engine(sampler, turn_token_budget=2).run(SEEDS, jax.random.key(1))
  _check_consistent(result, sampler, SEEDS, 2)
  turns = [t for s in result.sessions for t in s.turns]
  assert all(t.cut_at_budget and len(t.action_ids) == 2 and len(t.action) == 2 for t in turns)
  assert result.ledger.cut_at_budget == len(turns)


@pytest.mark.parametrize("cap", [18, 28, 40])
def test_context_cap_ends_sessions_before_overflow(cap):
  sampler = ScriptedSampler(p_stop=0.0)
  result = _engine(sampler, turn_token_budget=4, context_cap=cap).run(SEEDS, jax.random.key(2))
  _check_consistent(result, sampler, SEEDS, 2)
  for r, s in enumerate(result.sessions):
    assert len(sampler.last_state["rows"][r]) <= cap
    assert s.context_cap or s.num_turns == 4
  assert any(s.context_cap for s in result.sessions)
  if cap == 18:  # prompt + first observation + budget do not fit: no turn at all
    assert all(s.num_turns == 0 and not s.trainable for s in result.sessions)


def test_engine_turn_limit():
  result = _engine(max_turns=2).run(SEEDS, jax.random.key(0))
  assert all(s.truncated and s.num_turns == 2 for s in result.sessions)


def test_faulty_env_ends_only_its_session():
  sampler = ScriptedSampler()
  seeds = list(range(10))
  factory = lambda: make("faulty", env=CountEnv(horizon=4), rate=0.2)
  result = _engine(sampler, factory=factory).run(seeds, jax.random.key(5))
  _check_consistent(result, sampler, seeds, 2)
  errors = [s for s in result.sessions if s.env_error]
  assert 0 < len(errors) < len(result.sessions)
  for s in errors:
    assert s.turns[-1].env_error and "injected fault" in s.error and not s.trainable
  assert all(s.num_turns == 4 for s in result.sessions if not s.env_error)
  assert result.ledger.end_reasons["env_error"] == len(errors)
  assert result.ledger.untrainable_tokens == sum(s.num_obs_tokens + s.num_action_tokens for s in errors)


def test_reset_and_factory_failures_are_env_errors():
  calls = iter(range(100))

  def factory():
    i = next(calls)
    if i == 0:
      raise RuntimeError("cannot build")
    return CountEnv(horizon=2, fail_reset=(i == 1))

  result = _engine(factory=factory, num_env_threads=1).run(SEEDS, jax.random.key(0))
  errors = [s for s in result.sessions if s.env_error]
  assert len(errors) == 2 and all(s.num_turns == 0 for s in errors)
  assert {s.error for s in errors} == {"RuntimeError('cannot build')", "RuntimeError('reset failed')"}
  result.ledger.check(result.sessions)


def test_bad_config_is_named():
  with pytest.raises(ValueError, match="context_cap"):
    _engine(turn_token_budget=64, context_cap=64)
  with pytest.raises(ValueError, match="group_size"):
    _engine(group_size=0)
