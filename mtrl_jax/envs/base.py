"""The environment protocol: text in, text out, one stateful session per object.

An `Env` is a multi-turn task. `reset(seed)` starts an episode and returns the
fixed task prompt plus the first observation; each `step(action)` consumes one
action string and returns the next observation, a reward and two end flags.
Subclasses implement `_reset` / `_step`; the base class keeps the bookkeeping
every env needs and nobody should re-implement: the seed, the action history
(for `replay`), the turn counter, the `max_turns` cut, and the `info` keys that
consumers rely on (`invalid_action` always, `success` at the end, `turn_reward`
always: 1.0 for an action the env accepted, 0.0 for an invalid one, unless the
env sets its own; `state_key` where the env names its states, see `state_key`).

Pure Python and numpy only: envs run in host threads next to jitted code, and
nothing here may know about models, sampling or training.
"""
from __future__ import annotations

import abc
import copy
import hashlib
import random
import re
from typing import Any, NamedTuple, Sequence

# How a built-in env talks: 'terse' is the compact protocol made for the byte
# model ("peek or skip?"); 'natural' is plain English a pretrained instruct
# model can read, with lenient parsing of its replies ("I will peek." -> peek).
STYLES = ("terse", "natural")


class Reset(NamedTuple):
  """What an episode starts with."""
  prompt: str        # fixed task instructions (short for built-ins)
  observation: str   # the first observation


class Step(NamedTuple):
  """What one action returns."""
  observation: str
  reward: float
  terminated: bool   # the task itself ended (won, lost, submitted)
  truncated: bool    # a horizon / turn limit cut the episode
  info: dict


class EnvError(RuntimeError):
  """An environment failed (not the agent): a crashed tool, a lost server.

  Rollout code should count it and drop or retry the episode, never train on it.
  """


def derive_seed(*parts: Any) -> int:
  """A stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED)."""
  digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") >> 1


class Env(abc.ABC):
  """Base class of every environment (built-ins, adapters and wrappers).

  Subclasses set `self.max_turns` in `__init__` and implement:
    `_reset(seed) -> Reset`, `_step(action) -> Step`,
    `expert_action() -> str`, `random_action(rng) -> str`.
  They draw all randomness from `self.rng` (a `random.Random(seed)` made by
  `reset`), never from the global `random` module.
  """

  name: str = ""        # registry name, set by `registry.register`
  max_turns: int = 0    # steps after which the episode is truncated

  def __new__(cls, *args, **kwargs):
    # Remember the constructor arguments so `fresh()` / `replay()` can rebuild
    # an identical env without each subclass storing its own config.
    self = super().__new__(cls)
    self._init_args = (args, dict(kwargs))
    return self

  # -- bookkeeping (do not override) ----------------------------------------

  def reset(self, seed: int, session: int | None = None) -> Reset:
    self.seed = int(seed)
    # Which session of the task this is (the rollout engines pass its session id). Only envs
    # with per-session randomness read it (`delayed`, `revisit`: their noise differs between
    # the sessions of one task); the task itself is still a function of `seed` alone.
    self.session = None if session is None else int(session)
    self.rng = random.Random(self.seed)
    self.actions: list[str] = []
    self.turn = 0
    self.done = False
    out = self._reset(self.seed)
    if self.natural:
      out = Reset(self.natural_prompt(), self.natural_observation(str(out.observation), None))
    return Reset(str(out.prompt), str(out.observation))

  def step(self, action: str) -> Step:
    if not hasattr(self, "done"):
      raise RuntimeError(f"{self.describe()}: call reset(seed) before step().")
    if self.done:
      raise RuntimeError(f"{self.describe()}: step() after the episode ended; call reset(seed).")
    action = str(action)
    anchor = self.state_key()  # the state this action is taken in, before it moves anything
    # A natural-style reply is read leniently; the env logic sees the canonical action.
    out = self._step(self.natural_action(action) if self.natural else action)
    self.actions.append(action)
    self.turn += 1
    if self.natural:
      out = out._replace(observation=self.natural_observation(str(out.observation), out))
    info = dict(out.info)
    info.setdefault("invalid_action", False)
    if anchor is not None:
      info.setdefault("state_key", str(anchor))
    info.setdefault("turn_reward", 0.0 if info["invalid_action"] else 1.0)
    terminated, truncated = bool(out.terminated), bool(out.truncated)
    if not terminated and self.turn >= self.max_turns:
      truncated = True
    if terminated or truncated:
      info.setdefault("success", False)
      self.done = True
    return Step(str(out.observation), float(out.reward), terminated, truncated, info)

  # -- styles (see STYLES) --------------------------------------------------

  @property
  def natural(self) -> bool:
    return getattr(self, "style", "terse") == "natural"

  def natural_prompt(self) -> str:
    raise NotImplementedError(f"{type(self).__name__} has no natural style")

  def natural_observation(self, terse: str, step: "Step | None") -> str:
    """The natural-style text of an observation (after `turn` actions; `step`
    is None at reset), given the terse one and the env's state."""
    raise NotImplementedError(f"{type(self).__name__} has no natural style")

  def natural_action(self, reply: str) -> str:
    """The canonical action a natural-style reply names (else the reply: invalid)."""
    return reply

  # -- copies ---------------------------------------------------------------

  @property
  def config(self) -> dict:
    """The keyword arguments this env was built with."""
    return dict(self._init_args[1])

  def fresh(self) -> "Env":
    """A new env with the same configuration, not yet reset."""
    args, kwargs = self._init_args
    return type(self)(*args, **kwargs)

  def clone(self) -> "Env":
    """An independent copy at the current state; it continues identically."""
    return copy.deepcopy(self)

  def replay(self, seed: int | None = None, actions: Sequence[str] | None = None) -> "Env":
    """Rebuild from (seed, action history); defaults to this env's own history."""
    session = getattr(self, "session", None) if seed is None or seed == self.seed else None
    seed = self.seed if seed is None else seed
    actions = list(self.actions if actions is None else actions)
    env = self.fresh()
    env.reset(seed, session)
    for a in actions:
      env.step(a)
    return env

  def redraw(self, seed: int) -> None:
    """Fresh draws of the randomness the policy has not seen yet (the lab's forks).

    The default reseeds `self.rng`: right for an env that draws as it goes. An env
    that draws its hidden future at reset (`bifurcation`'s noise and payoff) overrides it.
    """
    self.rng = random.Random(seed)

  def describe(self) -> str:
    kw = ", ".join(f"{k}={v!r}" for k, v in self._init_args[1].items())
    return f"{self.name or type(self).__name__}({kw})"

  # -- to implement ---------------------------------------------------------

  @abc.abstractmethod
  def _reset(self, seed: int) -> Reset:
    ...

  @abc.abstractmethod
  def _step(self, action: str) -> Step:
    ...

  @staticmethod
  def first_decision(action: str, observation: str | None = None) -> str | None:
    """What the turn-0 action decided, for env-agnostic readouts (None: nothing declared).

    A probe whose future return depends only on its first choice (`bifurcation`'s
    arm, `memory`'s peek) names that choice here; the critic readout
    (train/critic_readout.py) builds its oracle critic from it. Where what the
    choice is worth depends on what turn 0 showed (`delayed(cue=True)`: whether the
    arm is the one the sign names), it reads `observation` (turn 0's observation)
    too; an override may take the action alone. An env that declares nothing gets
    the readout's empirical oracle, keyed by its task and turn-0 action.
    """
    del action, observation
    return None

  def decision_value(self, turn: int, decision: str) -> float | None:
    """Expected return from the start of `turn` on, given the turn-0 decision (None: not known in closed form).

    Only for probes whose future return is a known function of their first
    choice whatever the policy does later (`bifurcation`); the critic readout
    estimates it from the batch otherwise. Reads the constructor's settings.
    """
    del turn, decision
    return None

  @abc.abstractmethod
  def expert_action(self) -> str:
    """The scripted expert's action at the current state."""

  @abc.abstractmethod
  def random_action(self, rng: random.Random) -> str:
    """A uniform draw over a sensible action set (bad actions included)."""

  def state_key(self) -> str | None:
    """A key of the environment's current state, or None (the default: no key).

    Two sessions of the same task whose keys are equal stand in the same
    state: whatever they do next has the same consequences. `step` reports
    the key of the state each action was taken in as `info["state_key"]`
    (the anchor state of GiGPO-style step groups); override it where the
    state is small enough to name.
    """
    return None

  def suboptimal_action(self, rng: random.Random) -> str:
    """What a flawed expert does when it errs (the demos' quality knob).

    Defaults to a random action; an env whose interesting mistake is a
    specific one (memory: not paying to peek) overrides it.
    """
    return self.random_action(rng)


def check_style(env_name: str, style: str) -> str:
  if style not in STYLES:
    raise ValueError(f"{env_name}: style must be one of {STYLES}, got {style!r}")
  return style


_PUNCT = " \t\n\r.,;:!?\"'`*()[]{}<>"


def pick_option(reply: str, options: Sequence[str]) -> str | None:
  """The one option a free-text reply names, or None.

  The reply itself (case, quotes, brackets and trailing punctuation ignored)
  if it is an option; else the only option appearing in it as a word
  ("I will peek." -> "peek"); replies naming none or several are None.
  """
  lowered = {o.lower(): o for o in options}
  text = reply.strip().strip(_PUNCT).lower()
  if text in lowered:
    return lowered[text]
  words = set(re.findall(r"[\w]+", reply.lower()))
  found = [o for low, o in lowered.items() if low in words]
  return found[0] if len(found) == 1 else None


def replay(env: Env, seed: int, actions: Sequence[str]) -> Env:
  """Function form of `Env.replay`."""
  return env.replay(seed, actions)


def policy_action(env: Env, policy: str, rng: random.Random, quality: float = 1.0) -> str:
  """One action of a named scripted policy.

  policy: 'expert' (with probability 1 - quality it takes the env's
  `suboptimal_action` instead, by default a random one: the knob for
  low-quality demonstrations) or 'random'.
  """
  if policy == "random":
    return env.random_action(rng)
  if policy == "expert":
    if quality < 1.0 and rng.random() >= quality:
      return env.suboptimal_action(rng)
    return env.expert_action()
  raise ValueError(f"unknown policy {policy!r}; valid: 'expert', 'random'")
