"""`bifurcation`: the arm decides the payoff, nothing after turn 0 does, and the noise is shared."""
import numpy as np
import pytest

from mtrl_jax import envs


def play(env, seed, arm, echo=True):
  env.reset(seed)
  rewards = [env.step(arm).reward]
  for t in range(env.length):
    rewards.append(env.step(env.tokens[t] if echo else "zz").reward)
  out = env.step("done")
  rewards.append(out.reward)
  assert out.terminated and env.turn == env.length + 2
  return rewards, out.info["success"]


def test_payoff_rates_follow_the_arm_not_the_distractors():
  """Mean payoff of each arm is its probability (2000 seeds, 4 sigma); echoing wrong changes nothing.

  Catches: swapped arms, the draw compared the wrong way (`>` for `<`), or a payoff that depends
  on the distractor actions."""
  env = envs.make("bifurcation", length=3, p_good=0.8, p_bad=0.2, cost=0.1, noise=0.1)
  n = 2000
  for arm, p in (("left", 0.8), ("right", 0.2)):
    paid = np.array([play(env, s, arm)[1] for s in range(n)], float)
    assert abs(paid.mean() - p) < 4 * np.sqrt(p * (1 - p) / n), (arm, paid.mean())
    sloppy = np.array([play(env, s, arm, echo=False)[1] for s in range(n)], float)
    np.testing.assert_array_equal(paid, sloppy)


def test_cost_noise_and_common_random_numbers():
  """The good arm pays -cost at once; each distractor pays +-noise, the same for both arms under a seed.

  Catches: the cost on the wrong arm, noise drawn after the choice (the arms would then see
  different noise: no common random numbers for the lab), noise of the wrong size."""
  env = envs.make("bifurcation", length=6, cost=0.25, noise=0.5, p_good=1.0, p_bad=0.0)
  for seed in range(20):
    left, ok_l = play(env, seed, "left")
    right, ok_r = play(env, seed, "right")
    assert left[0] == -0.25 and right[0] == 0.0
    assert left[1:-1] == right[1:-1] and all(abs(r) == 0.5 for r in left[1:-1])
    assert (left[-1], ok_l, right[-1], ok_r) == (1.0, True, 0.0, False)
  signs = [play(env, s, "left")[0][1] for s in range(200)]
  assert 60 < sum(x > 0 for x in signs) < 140  # both signs, about even


def test_invalid_flags_and_bad_kwargs():
  env = envs.make("bifurcation", length=1)
  env.reset(0)
  assert env.step("up").info["invalid_action"]  # not an arm: counted, plays the free arm
  assert env.arm == "right"
  assert env.step("??").info["invalid_action"]
  assert env.step("finish").info["invalid_action"]
  for bad in ({"length": -1}, {"cost": -0.1}, {"p_good": 1.5}, {"p_bad": -0.1}, {"noise": -1}):
    with pytest.raises(ValueError, match=list(bad)[0]):
      envs.make("bifurcation", **bad)


def test_demos_take_the_free_arm_at_the_quality_rate():
  """Demos at quality q pick the good arm about q of the time and echo correctly everywhere else."""
  import random
  env = envs.make("bifurcation", length=2)
  rng = random.Random(0)
  firsts = []
  for seed in range(400):
    env.reset(seed)
    firsts.append(envs.policy_action(env, "expert", rng, quality=0.5))
    env.step(firsts[-1])
    for t in range(2):
      assert envs.policy_action(env, "expert", rng, quality=0.5) == env.tokens[t]
      env.step(env.tokens[t])
  assert 160 < firsts.count("left") < 240 and set(firsts) == {"left", "right"}
