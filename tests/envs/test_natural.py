"""style='natural': the same tasks in English, replies read leniently."""
import random

import pytest

from mtrl_jax import envs
from mtrl_jax.envs.base import pick_option
from env_test_utils import success_rate

VARIANTS = [
    ("memory", {}), ("memory", {"length": 2, "hint": True, "code_alphabet": "letters"}),
    ("memory", {"distractor": "wait"}),
    ("bifurcation", {"p_good": 1.0}), ("bifurcation", {"length": 1}),
    ("keydoor", {}), ("keydoor", {"corridor": True, "size": 6}), ("keydoor", {"view": 1}),
    ("repair", {}), ("repair", {"bugs": 2, "length": 5}),
]


@pytest.mark.parametrize("name,kwargs", VARIANTS)
def test_same_episode_as_terse_but_in_english(name, kwargs):
  """Natural style changes the words only: for the same seed and actions the
  rewards, end flags and info are the terse ones; the texts differ and are
  sentences that show the same symbols. Break checked: natural_observation
  called before the turn counter moves (the letter to echo is the previous
  one); an arm parsed from the natural reply differently from the terse one
  (bifurcation rewards differ)."""
  rng = random.Random(3)
  for seed in range(6):
    terse, nat = envs.make(name, **kwargs), envs.make(name, style="natural", **kwargs)
    a, b = terse.reset(seed), nat.reset(seed)
    assert a.prompt != b.prompt and a.observation != b.observation
    assert len(b.prompt.split()) > 15 and b.observation.rstrip()[-1] in "?.!"
    while True:
      action = envs.policy_action(terse, "expert", rng, quality=0.6)
      x, y = terse.step(action), nat.step(action)
      assert (x.reward, x.terminated, x.truncated, x.info) == (y.reward, y.terminated, y.truncated, y.info)
      assert y.observation != x.observation and y.observation.rstrip()[-1] in "?.!"
      _same_information(x.observation, y.observation)
      if x.terminated or x.truncated:
        break


def _same_information(terse: str, natural: str):
  """Every symbol the terse text shows (a code, a letter to echo, a number),
  and every map / program line, is in the natural text."""
  import re
  words = set(re.findall(r"[\w-]+", natural))
  shown = "\n".join(ln for ln in terse.splitlines() if not ln.startswith("key "))  # keydoor's flag: a sentence
  for sym in re.findall(r"(?<![\w-])[\w-]{1,2}(?![\w-])", shown):
    if sym not in ("f", "ok"):
      assert sym in words, (sym, terse, natural)
  lines = terse.splitlines()
  if len(lines) > 1:
    for line in lines:
      if not line.startswith("key "):
        assert line in natural.splitlines(), (line, natural)


@pytest.mark.parametrize("name", ["memory", "keydoor", "repair"])
def test_expert_succeeds_in_natural_style(name):
  assert success_rate(envs.make(name, style="natural"), "expert", 100) >= 0.95


def test_memory_natural_texts():
  env = envs.make("memory", length=1, hint=True, style="natural")
  first = env.reset(5)
  assert "peek" in first.observation and "skip" in first.observation
  out = env.step("I will peek.")
  assert out.reward == -0.05 and not out.info["invalid_action"]
  assert f"The code is {env.code}." in out.observation and f"letter {env.tokens[0]}" in out.observation
  out = env.step(f"The letter is {env.tokens[0]}")
  assert not out.info["invalid_action"] and out.observation == f"Reminder: the code was {env.code}. What is the code?"
  out = env.step(f"The code is {env.code}.")
  assert out.info["success"] and out.reward == 1.0 and out.observation == "Right, that is the code!"
  # Ambiguous or empty replies stay invalid.
  env.reset(5)
  assert env.step("peek or skip").info["invalid_action"]
  env.reset(5)
  assert env.step("").info["invalid_action"]


def test_lenient_parsing():
  assert pick_option("  Peek! ", ("peek", "skip")) == "peek"
  assert pick_option("'skip'", ("peek", "skip")) == "skip"
  assert pick_option("I choose to skip it", ("peek", "skip")) == "skip"
  assert pick_option("peek, not skip", ("peek", "skip")) is None
  assert pick_option("peeking", ("peek", "skip")) is None  # whole words only
  kd = envs.make("keydoor", style="natural")
  assert kd.natural_action("I pick up the key.") == "pick"
  assert kd.natural_action("Go up") == "up" and kd.natural_action("open the door") == "open"
  rp = envs.make("repair", style="natural")
  assert rp.natural_action("Let me view the program.") == "view"
  assert rp.natural_action("`e2 add 3`") == "e2 add 3"
  assert rp.natural_action("Replace it: edit line 3 mul 2.") == "e3 mul 2"
  assert rp.natural_action("run and submit") == "run and submit"  # two commands: invalid


def test_terse_is_the_default_and_unchanged():
  env = envs.make("memory")
  assert env.style == "terse" and env.reset(0).observation == "peek or skip?"
  assert env.step("I will peek.").info["invalid_action"]  # the byte protocol stays strict


@pytest.mark.parametrize("name", ["memory", "bifurcation", "keydoor", "repair"])
def test_bad_style_is_named(name):
  with pytest.raises(ValueError, match=f"{name}: style must be one of"):
    envs.make(name, style="english")
