"""The `revisit` probe: DP values against Monte-Carlo returns, recurring state keys (step groups
that are not episode groups), per-session slips and noise (CRN only when asked)."""
import collections
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtrl_jax import envs
from mtrl_jax.envs.revisit import corridor_values


def _play(env, seed, session, p_right, rng):
  """[(state_key, turn, reward)] of one session of a policy saying right with probability p_right."""
  env.reset(seed, session)
  out = []
  while not env.done:
    t = env.turn
    step = env.step("right" if rng.random() < p_right else "left")
    out.append((step.info["state_key"], t, step.reward))
  return out


@pytest.mark.parametrize("p_right", [1.0, 0.5])
def test_dp_values_equal_monte_carlo_returns(p_right):
  """corridor_values[k, cell] is the mean return from a state with k turns left (n = 3000 sessions
  of the policy; tolerance 4 standard errors), at the start and at every later (turn, cell) with
  at least 300 visits. Catches the slip applied with the wrong sign (r = p_right slip + ...),
  the wall at 0 (a step left from 0 leaving the corridor) or an off-by-one in the turns left."""
  size, h, n = 5, 10, 3000
  env = envs.make("revisit", size=size, horizon=h, slip=0.25, noise=0.2)
  v = corridor_values(size, h, 0.25, p_right)
  rng = random.Random(1)
  by_state = collections.defaultdict(list)
  for i in range(n):
    traj = _play(env, i % 20, i, p_right, rng)
    rewards = np.array([r for _, _, r in traj])
    for j, (key, t, _) in enumerate(traj):
      by_state[(t, int(key[1:]))].append(rewards[j:].sum())
  checked = 0
  for (t, cell), rets in by_state.items():
    if len(rets) >= 300:
      rets = np.array(rets)
      se = rets.std(ddof=1) / math.sqrt(len(rets))
      assert abs(rets.mean() - v[h - t, cell]) < 4 * se + 1e-9, (t, cell, rets.mean(), v[h - t, cell])
      checked += 1
  assert checked >= 8
  env.reset(0, 0)
  assert env.state_value(p_right) == pytest.approx(v[h, 0])


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 8), h=st.integers(1, 12), slip=st.floats(0.0, 0.49), p=st.floats(0.0, 1.0))
def test_dp_values_are_probabilities_that_grow_with_time(size, h, slip, p):
  """Values are arrival probabilities: in [0, 1], non-decreasing in the turns left, non-increasing
  in the distance to the goal (a step right never hurts); with no slip and the expert, 1 exactly
  when the goal is within reach. Catches a DP that pays the goal more than once or reads v[k]
  instead of v[k - 1]."""
  v = corridor_values(size, h, slip, p)
  assert np.all(v >= -1e-12) and np.all(v <= 1 + 1e-12)
  assert np.all(np.diff(v, axis=0) >= -1e-12)
  assert np.all(np.diff(v[:, :size - 1], axis=1) >= -1e-12)
  exact = corridor_values(size, h, 0.0, 1.0)
  for k in range(h + 1):
    for c in range(size - 1):
      assert exact[k, c] == (1.0 if size - 1 - c <= k else 0.0)


def test_state_keys_recur_within_and_across_sessions():
  """In a group of 8 sessions of one task (expert policy, slip 0.3), some cell is the anchor of
  actions at different turns of one session, and step groups (actions sharing a key) differ from
  turn-aligned groups. Catches a key that includes the turn (no key would recur in a session)."""
  env = envs.make("revisit", size=4, horizon=12, slip=0.3)
  group = [_play(env, 7, s, 1.0, random.Random(s)) for s in range(8)]
  within = [max(collections.Counter(k for k, _, _ in traj).values()) for traj in group]
  assert max(within) >= 2
  turns_of_key = collections.defaultdict(set)
  for traj in group:
    for key, t, _ in traj:
      turns_of_key[key].add(t)
  assert any(len(ts) >= 3 for ts in turns_of_key.values())


def test_slips_and_noise_are_per_session_unless_crn():
  """Eight sessions of one task saying right every turn: per session they walk and earn apart,
  the same session id replays the same; with crn=True all eight are the same. Catches slips or
  noise drawn from the task seed, or crn ignored."""
  def runs(crn):
    env = envs.make("revisit", size=4, horizon=10, slip=0.3, crn=crn)
    return [tuple(_play(env, 3, s, 1.0, random.Random(0))) for s in range(8)]
  per_session = runs(False)
  assert len(set(per_session)) >= 6 and per_session == runs(False)
  assert len(set(runs(True))) == 1


def test_redraw_and_natural_style():
  """A clone replays the original's slips; redraw gives forks fresh ones. Natural replies are read
  leniently. Catches redraw not replacing the session's stream."""
  env = envs.make("revisit", size=6, horizon=30, slip=0.4)
  env.reset(0, 0)
  def future(e):
    return tuple(st.reward for st in (e.step("right") for _ in range(3)))
  assert future(env.clone()) == future(env.clone())
  forks = set()
  for k in range(6):
    f = env.clone()
    f.redraw(k)
    forks.add(future(f))
  assert len(forks) >= 3
  nat = envs.make("revisit", size=3, slip=0.0, noise=0.0, style="natural")
  assert "cell 0" in nat.reset(0, 0).observation
  s = nat.step("I go right.")
  assert (s.info["invalid_action"], s.observation) == (False, "You are in cell 1. Left or right?")
  s = nat.step("right")
  assert (s.reward, s.terminated, s.info["success"]) == (1.0, True, True)


@pytest.mark.parametrize("kw, field", [({"size": 1}, "size"), ({"slip": 0.5}, "slip"), ({"horizon": 0}, "horizon")])
def test_bad_config_names_its_field(kw, field):
  with pytest.raises(ValueError, match=field):
    envs.make("revisit", **kw)
