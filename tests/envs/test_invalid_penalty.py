"""`invalid_penalty` of memory and bifurcation: -penalty on exactly the invalid replies,
nothing else changes (the default 0 keeps the old rewards), and the closed-form oracle
value is withdrawn once the return depends on the policy's later replies."""
import pytest

from mtrl_jax.envs import registry


def play(env, seed, actions):
  env.reset(seed)
  return [env.step(a) for a in actions]


@pytest.mark.parametrize("penalty", [0.0, 0.25])
def test_memory_pays_the_penalty_on_invalid_replies_only(penalty):
  """peek (valid, -0.05), a wrong echo, the right echo, an answer outside the alphabet.

  Break checked: the penalty taken on every reply (or on none): the valid turns' rewards
  (-0.05 and 0) or the invalid ones' (-0.25) differ from the hand values."""
  env = registry.make("memory", length=2, hint=True, code_alphabet="letters", invalid_penalty=penalty)
  env.reset(7)
  s0 = env.step("peek")
  s1 = env.step("!!")                 # the cue asked for a letter: invalid
  s2 = env.step(env.expert_action())  # valid
  s3 = env.step("7")                  # not a letter code: invalid (and wrong)
  assert [s.info["invalid_action"] for s in (s0, s1, s2, s3)] == [False, True, False, True]
  assert [s.reward for s in (s0, s1, s2, s3)] == pytest.approx([-0.05, -penalty, 0.0, -penalty])
  assert s3.terminated and not s3.info["success"]


def test_memory_right_answer_keeps_its_payoff():
  env = registry.make("memory", length=1, hint=True, code_alphabet="letters", invalid_penalty=0.3)
  env.reset(3)
  env.step("peek")
  env.step(env.expert_action())
  last = env.step(env.expert_action())
  assert last.reward == pytest.approx(1.0) and last.info["success"]


def test_bifurcation_penalty_and_closed_form():
  """The noise and the payoff are unchanged; invalid replies pay -penalty on top. The
  closed-form oracle value exists without a penalty only.

  Break checked: `decision_value` keeping its closed form under a penalty: the last
  assert fails (the returns would then depend on replies the closed form ignores)."""
  plain = registry.make("bifurcation", length=2)
  pen = registry.make("bifurcation", length=2, invalid_penalty=0.2)
  a = play(plain, 5, ["left", "x", "?", "nope"])
  b = play(pen, 5, ["left", "x", "?", "nope"])
  invalid = [s.info["invalid_action"] for s in b]
  assert [s.reward - 0.2 * i for s, i in zip(a, invalid)] == pytest.approx([s.reward for s in b])
  assert sum(invalid) >= 2 and invalid[-1]  # the last reply must be "done"
  assert plain.decision_value(1, "left") == pytest.approx(0.95)
  assert pen.decision_value(1, "left") is None


@pytest.mark.parametrize("name", ["memory", "bifurcation"])
def test_negative_penalty_is_refused(name):
  with pytest.raises(ValueError, match="invalid_penalty"):
    registry.make(name, invalid_penalty=-0.1)
