"""The built-in suite: experts succeed, random does not, seeds and copies are exact."""
import random

import pytest

from mtrl_jax import envs
from env_test_utils import continue_with, run_episode, success_rate

BUILTINS = ["keydoor", "memory", "repair"]
VARIANTS = [
    ("keydoor", {}), ("keydoor", {"corridor": True, "size": 8}), ("keydoor", {"view": 1}),
    ("keydoor", {"size": 7}),
    ("memory", {}), ("memory", {"length": 0}), ("memory", {"length": 16, "num_codes": 26}),
    ("memory", {"distractor": "wait"}),
    ("repair", {}), ("repair", {"bugs": 3, "length": 6}), ("repair", {"partial_credit": True}),
    # bifurcation pays by chance even for the expert: p_good = 1 makes the expert exact.
    ("bifurcation", {"p_good": 1.0}),
    ("bifurcation", {"length": 12, "p_good": 1.0, "noise": 0.0}),
    # cashout pays at the end by chance: p_pay = 1 makes the expert (never stop) exact.
    ("cashout", {"p_pay": 1.0}), ("cashout", {"length": 9, "p_pay": 1.0, "cash": 0.0}),
]


@pytest.mark.parametrize("name", BUILTINS)
def test_expert_succeeds_and_random_does_not(name):
  env = envs.make(name)
  expert = success_rate(env, "expert", 200)
  rand = success_rate(env, "random", 200)
  assert expert >= 0.95, (name, expert)
  assert rand <= 0.3 and rand < expert - 0.5, (name, rand)


@pytest.mark.parametrize("name,kwargs", VARIANTS)
def test_expert_succeeds_on_variants(name, kwargs):
  assert success_rate(envs.make(name, **kwargs), "expert", 50) >= 0.95


@pytest.mark.parametrize("name,kwargs", VARIANTS)
def test_same_seed_same_episode(name, kwargs):
  for policy in ("expert", "random"):
    for seed in range(5):
      a = run_episode(envs.make(name, **kwargs), seed, policy)
      b = run_episode(envs.make(name, **kwargs), seed, policy)
      assert a == b
  # ... and different seeds give different tasks.
  env = envs.make(name, **kwargs)
  starts = {repr(run_episode(env, s)[0][:2]) for s in range(20)}
  assert len(starts) > 1


@pytest.mark.parametrize("name,kwargs", VARIANTS)
def test_clone_and_replay_continue_identically(name, kwargs):
  env = envs.make(name, **kwargs)
  rng = random.Random(7)
  for seed in range(4):
    env.reset(seed)
    for _ in range(rng.randrange(0, env.max_turns - 1)):
      if env.step(envs.policy_action(env, "expert", rng, quality=0.5)).terminated:
        env.reset(seed)  # too short: start over, the copies begin from any state
        break
    clone = env.clone()
    replayed = envs.replay(env, env.seed, env.actions)
    assert replayed.turn == clone.turn == env.turn
    assert replayed.actions == clone.actions == env.actions
    # Drive the three copies with the same actions: the original's expert's.
    outs = {id(e): [] for e in (env, clone, replayed)}
    for _ in range(env.max_turns):
      if env.done:
        break
      action = env.expert_action()
      assert clone.expert_action() == replayed.expert_action() == action
      for e in (env, clone, replayed):
        outs[id(e)].append(continue_with(e, [action]))
    assert outs[id(env)] == outs[id(clone)] == outs[id(replayed)]


def test_clone_is_independent():
  env = envs.make("memory")
  env.reset(3)
  env.step("peek")
  clone = env.clone()
  clone.step("x")
  assert env.turn == 1 and clone.turn == 2 and env.actions == ["peek"]


@pytest.mark.parametrize("name,kwargs", VARIANTS)
def test_text_is_compact(name, kwargs):
  env = envs.make(name, **kwargs)
  limit = 40 if not kwargs else 80  # <= 40 characters at the default knobs
  for seed in range(10):
    for policy in ("expert", "random"):
      transcript, _ = run_episode(env, seed, policy)
      prompt, first = transcript[0]
      assert len(prompt) <= 90 and len(first) <= limit
      for action, obs, *_ in transcript[1:]:
        assert len(obs) <= limit, obs
        assert 1 <= len(action) <= 8 or policy == "random", action
        assert obs.isascii() and action.isascii()


@pytest.mark.parametrize("name", BUILTINS + ["bifurcation"])
def test_info_keys_and_horizon(name):
  env = envs.make(name)
  rng = random.Random(0)
  for seed in range(30):
    env.reset(seed)
    while True:
      out = env.step(env.random_action(rng))
      assert "invalid_action" in out.info
      if out.terminated or out.truncated:
        assert "success" in out.info
        assert not (out.terminated and out.truncated)
        break
      assert "success" not in out.info
    assert env.turn <= env.max_turns
    with pytest.raises(RuntimeError, match="after the episode ended"):
      env.step("x")


def test_step_before_reset_is_an_error():
  with pytest.raises(RuntimeError, match="reset"):
    envs.make("memory").step("peek")


# -- memory: the credit probe ---------------------------------------------


def test_memory_rewards_and_observations():
  env = envs.make("memory", length=2)
  first = env.reset(5)
  assert first.observation == "peek or skip?"
  out = env.step("peek")
  code = env.code
  assert out.reward == pytest.approx(-0.05)
  assert out.observation.startswith(f"code {code} say ")
  token = out.observation.split()[-1]
  out = env.step(token)
  assert not out.info["invalid_action"] and out.reward == 0.0
  out = env.step("?")  # a wrong echo is flagged, costs nothing, the episode goes on
  assert out.info["invalid_action"] and out.reward == 0.0 and out.observation == "answer?"
  out = env.step(code)
  assert out == envs.Step("right", 1.0, True, False, {"invalid_action": False, "success": True,
                                                      "state_key": "t3:peek", "turn_reward": 1.0})


def test_memory_skip_means_guessing():
  env = envs.make("memory", num_codes=4)
  rng = random.Random(0)
  wins = 0
  for seed in range(400):
    env.reset(seed)
    out = env.step("skip")
    assert out.reward == 0.0 and "code" not in out.observation.replace("no code", "")
    for _ in range(env.length):
      env.step(env.expert_action())
    wins += env.step(rng.choice(env.codes)).info["success"]
  assert 0.15 < wins / 400 < 0.35  # 1 / num_codes


def test_memory_expert_return_and_horizon():
  env = envs.make("memory", length=6)
  transcript, success = run_episode(env, 0)
  assert success and env.max_turns == 8 and len(transcript) == 9
  assert sum(step[2] for step in transcript[1:]) == pytest.approx(0.95)


# -- keydoor and repair specifics ------------------------------------------


def test_keydoor_reward_only_for_opening_with_key():
  env = envs.make("keydoor", size=4)
  env.reset(1)
  out = env.step("open")  # no key yet
  assert out.info["invalid_action"] and out.reward == 0.0 and not out.terminated
  rewards = []
  while not env.done:
    out = env.step(env.expert_action())
    rewards.append(out.reward)
  assert rewards[-1] == 1.0 and sum(rewards[:-1]) == 0.0 and out.info["success"]
  assert "pick" in env.actions and env.actions[-1] == "open"


def test_keydoor_partial_view_hides_the_far_grid():
  env = envs.make("keydoor", size=7, view=1)
  obs = env.reset(0).observation
  assert obs.count("\n") == 3 and all(len(row) == 3 for row in obs.splitlines()[:3])


def test_repair_tools():
  env = envs.make("repair", length=3, bugs=1)
  env.reset(2)
  assert env.step("run").observation.startswith("pass ")
  listing = env.step("view").observation.splitlines()
  assert [line.split()[0] for line in listing] == ["1", "2", "3"]
  assert env.step("e9 add 1").info["invalid_action"]
  assert env.step("hello").info["invalid_action"]
  while not env.done:
    out = env.step(env.expert_action())
  assert out.info["success"] and out.reward == 1.0 and out.observation == "pass 5/5"


def test_repair_submitting_the_buggy_program_fails():
  env = envs.make("repair")
  for seed in range(50):
    env.reset(seed)
    out = env.step("submit")
    assert out.terminated and out.reward == 0.0 and not out.info["success"]
