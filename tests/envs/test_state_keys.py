"""The envs' anchor state keys and turn rewards (info["state_key"], info["turn_reward"]),
and the `cashout` probe."""
import random

import numpy as np
import pytest

from mtrl_jax import envs

KEYED = [("memory", {"length": 3}), ("memory", {"length": 2, "hint": True}), ("bifurcation", {"length": 3}),
         ("keydoor", {"size": 4}), ("cashout", {"length": 4}),
         ("textarena", {"game": "FrozenLake-v0"}), ("textarena", {"game": "Sokoban-v0"})]


def _walk(env, seed, rng, quality, keep=10):
  """(key, copy of the env) before each of the first `keep` actions of one episode."""
  env.reset(seed)
  out = []
  while not env.done:
    a = envs.policy_action(env, "expert", rng, quality=quality)
    key = env.state_key()
    if len(out) < keep:
      out.append((key, env.clone()))
    step = env.step(a)
    assert step.info["state_key"] == key  # the key of the state the action was taken in
  return out


def _future(env, actions):
  """(reward, key, observation) of each of `actions` from env's state (on a clone)."""
  env = env.clone()
  out = []
  for a in actions:
    if env.done:
      break
    st = env.step(a)
    out.append((st.reward, st.info.get("state_key"), st.observation, st.terminated))
  return out


@pytest.mark.parametrize("name,kwargs", KEYED)
def test_equal_keys_mean_equal_futures(name, kwargs):
  """Within a task (one seed), two histories that reach the same state key
  continue identically under the same actions: the key names everything that
  decides the rest of the episode, which is what grouping turns by it assumes.
  Keydoor's and the TextArena games' keys leave out the turn count (a cell
  visited again is the same anchor state, GiGPO's case), so there the
  futures are compared while every copy is inside its horizon.
  Break checked: memory's key without the peek choice ("t1" after both peek
  and skip) fails on the hinted memory (its final cue repeats a peeked
  code; without the hint the env's future does not depend on the peek, only
  the agent's knowledge does, which the key keeps apart on purpose);
  bifurcation's without the arm fails (the arm decides the payoff)."""
  env = envs.make(name, **kwargs)
  rng = random.Random(0)
  checked = 0
  # Sokoban's expert searches up to 300k states whenever a detour left its plan: random moves there.
  # Its random episodes run to the 100-turn limit: only the first 10 turns of a walk are filed.
  sokoban = kwargs.get("game") == "Sokoban-v0"
  quality = 0.0 if sokoban else 0.5
  for seed in range(1 if sokoban else 3):
    states = {}
    for _ in range(8 if sokoban else 12):
      for key, copy in _walk(env, seed, rng, quality=quality):
        states.setdefault(key, []).append(copy)
    probe = random.Random(seed)
    for key, same in states.items():
      if len(same) < 2:
        continue
      tail = [envs.policy_action(same[0], "expert", probe, quality=quality) for _ in range(same[0].max_turns)]
      n = min([e.max_turns - e.turn for e in same] + [12])
      futures = [_future(e, tail[:n]) for e in same]
      assert all(f == futures[0] for f in futures), (name, key)
      checked += 1
  assert checked >= 3, checked  # the check ran on shared states


@pytest.mark.parametrize("name,kwargs", KEYED + [("repair", {})])
def test_turn_reward_is_one_for_an_accepted_action(name, kwargs):
  """info["turn_reward"] = 1.0 when the env accepts the action, 0.0 when it
  flags it invalid (the base class's default; no built-in overrides it)."""
  env = envs.make(name, **kwargs)
  rng = random.Random(1)
  seen = set()
  for seed in range(6):
    env.reset(seed)
    while not env.done:
      out = env.step(env.random_action(rng) if rng.random() < 0.5 else env.expert_action())
      assert out.info["turn_reward"] == (0.0 if out.info["invalid_action"] else 1.0)
      seen.add(out.info["invalid_action"])
  assert True in seen or name == "repair"  # random actions do hit invalid ones (repair's tools accept most)


def test_envs_without_a_key_report_none():
  """An env that names no state (repair, a TextArena game without a small state) puts no key in the info."""
  env = envs.make("repair")
  env.reset(0)
  assert "state_key" not in env.step(env.expert_action()).info
  ta = envs.make("textarena", game="Blackjack-v0")
  ta.reset(0)
  assert ta.state_key() is None and "state_key" not in ta.step(ta.random_action(random.Random(0))).info


# -- cashout --------------------------------------------------------------------


def test_cashout_stop_pays_cash_and_ends_the_episode():
  """Break checked: a stop that does not terminate, or pays the payoff instead of the cash, fails."""
  env = envs.make("cashout", length=4, cash=0.25, p_pay=1.0)
  env.reset(3)
  assert env.step(env.tokens[0]).reward == 0.0
  out = env.step("stop")
  assert out.terminated and out.reward == 0.25 and out.observation == "cashed out"
  assert out.info["early_exit"] and not out.info["success"] and out.info["turn_reward"] == 1.0
  assert env.turn == 2


def test_cashout_payoff_rate_and_shared_luck():
  """Reaching the end pays 1.0 with probability p_pay (2000 seeds, 4 sigma),
  drawn at reset: the same seed pays the same whatever the echoes were.
  Break checked: the draw compared the wrong way (p_pay 0.8 -> 0.2) fails."""
  env = envs.make("cashout", length=3, p_pay=0.8)
  paid, sloppy = [], []
  for seed in range(2000):
    for echo, out in ((True, paid), (False, sloppy)):
      env.reset(seed)
      for t in range(3):
        env.step(env.tokens[t] if echo else "zz")
      st = env.step("done")
      assert st.terminated and not st.info.get("early_exit", False)
      out.append(st.reward)
  paid = np.array(paid)
  assert abs(paid.mean() - 0.8) < 4 * np.sqrt(0.8 * 0.2 / 2000)
  np.testing.assert_array_equal(paid, sloppy)


def test_cashout_demo_policies():
  """The expert never stops; the tempting mistake is to stop (no way out on the payoff turn)."""
  env = envs.make("cashout", length=3)
  env.reset(0)
  rng = random.Random(0)
  for t in range(3):
    assert env.suboptimal_action(rng) == "stop"
    env.step(env.expert_action())
  assert env.suboptimal_action(rng) == "done" and env.state_key() == "t3"


def test_cashout_rejects_bad_arguments():
  for kw, field in (({"length": 0}, "length"), ({"cash": -1.0}, "cash"), ({"p_pay": 1.5}, "p_pay")):
    with pytest.raises(ValueError, match=field):
      envs.make("cashout", **kw)
