"""`delayed`: a choice paid `horizon - 1` turns later, through per-session noise, with long actions.

The probe where the horizon matters to every credit estimator. Turn 0 picks an
arm: `left` costs `cost` at once and pays +1.0 at the end with probability
`p_good`; `right` is free and pays with probability `p_bad`. Turns 1 ..
horizon-1 copy a string of `tokens_per_action` letters shown in the
observation (one byte-model token each: long actions stay learnable, a copy),
and each pays a zero-mean `+-noise`; the last of them also pays the arm's
payoff. Unlike `bifurcation`, the noise signs and the payoff draw are the
*session's* (see envs/session_noise.py): sessions of one group share the task
(the strings) but not the noise, so no group baseline cancels it, and the
noise grows with the horizon the way a long session's does. `crn=True` gives
every session of a task the same draws (common random numbers, for the lab).

  reset -> "left or right?"
  left  -> "say qmz"        (reward -cost)
  qmz   -> "say kfa"        (reward +-noise)
  kfa   -> "paid"           (reward +-noise, +1.0 with prob p_good; terminated, success = paid)

A session has 1 + (horizon - 1) * tokens_per_action action tokens (plus one
stop token a turn): horizon 128 at 100 tokens an action is ~12.7k.
Expected return from turn t given the arm (`decision_value`, exact when
`invalid_penalty` is 0): p(arm) - cost [arm = left, t = 0].

`cue=True` (issue 43's probe): the good arm is the task's, left or right, and
turn 0's observation names it ("sign right: left or right?"). The arm that
pays depends on what the agent sees, so a critic must read the sign and the
reply together, and quality-0.5 demos (the cued arm or the other, half and
half whatever the sign) leave a warm start at chance at the decision. The
decision is then "cued" or "uncued" (`first_decision(action, observation)`),
pooled over tasks; its value is the same closed form with the cued arm in
left's place.

`draw_seed` salts the hidden-draw stream (envs/session_noise.py): runs that
set it to their own seed see different eval draws on the same eval tasks and
sessions, each reproducible.
"""
from __future__ import annotations

import random
import re

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.memory import ECHO_SYMBOLS
from mtrl_jax.envs.registry import register
from mtrl_jax.envs.session_noise import noise_rng

ARMS = ("left", "right")
CUED, UNCUED = "cued", "uncued"
# The sign in turn 0's observation, terse ("sign right: ...") or natural ("A sign says the right path pays").
_SIGN = re.compile(r"\bsign\b\D*?\b(left|right)\b", re.IGNORECASE)


@register("delayed")
class Delayed(Env):
  """Pick an arm, copy `horizon - 1` strings through per-session noise, collect the arm's payoff."""

  def __init__(self, horizon: int = 2, tokens_per_action: int = 1, cost: float = 0.1, p_good: float = 0.95,
               p_bad: float = 0.3, noise: float = 0.1, crn: bool = False, invalid_penalty: float = 0.0,
               style: str = "terse", cue: bool = False, draw_seed: int = 0):
    """
    Args:
      horizon: turns in a session (>= 2): the choice, then horizon - 1 copy turns.
      tokens_per_action: letters in each string to copy (>= 1; a byte-model token each).
      cost: paid (as -cost) at once for the good arm (`left`), >= 0.
      p_good / p_bad: payoff probability of `left` / `right`, in [0, 1].
      noise: each copy turn pays +noise or -noise with equal odds, drawn per session (>= 0).
      crn: common random numbers: every session of a task draws the same noise and payoff
        (for the lab); the default draws them per session.
      invalid_penalty: paid (as -invalid_penalty) for every invalid action (an arm that is
        neither left nor right, a wrong copy); >= 0. With it the return depends on the
        later replies too, and `decision_value` has no closed form.
      style: 'terse' (the byte model's protocol) or 'natural' (English).
      cue: the good arm is the task's (left or right, by the task seed) and turn 0 shows it;
        else it is always `left` and nothing shows it.
      draw_seed: salts the per-session hidden draws (0: the unsalted stream); see the module doc.
    """
    if horizon < 2:
      raise ValueError(f"delayed: horizon must be >= 2 (the choice and at least one copy turn), got {horizon}")
    if tokens_per_action < 1:
      raise ValueError(f"delayed: tokens_per_action must be >= 1, got {tokens_per_action}")
    if cost < 0 or noise < 0:
      raise ValueError(f"delayed: cost and noise must be >= 0, got cost={cost}, noise={noise}")
    for name, p in (("p_good", p_good), ("p_bad", p_bad)):
      if not 0.0 <= p <= 1.0:
        raise ValueError(f"delayed: {name} must be in [0, 1], got {p}")
    if invalid_penalty < 0:
      raise ValueError(f"delayed: invalid_penalty must be >= 0, got {invalid_penalty}")
    self.horizon, self.tokens_per_action = int(horizon), int(tokens_per_action)
    self.cost, self.noise, self.p_good, self.p_bad = float(cost), float(noise), float(p_good), float(p_bad)
    self.crn, self.invalid_penalty = bool(crn), float(invalid_penalty)
    self.cue, self.draw_seed = bool(cue), int(draw_seed)
    self.style = check_style("delayed", style)
    self.max_turns = self.horizon

  def _reset(self, seed: int) -> Reset:
    # What the agent is shown is the task's (self.rng: the seed); what it is not, the session's.
    self.strings = ["".join(self.rng.choice(ECHO_SYMBOLS) for _ in range(self.tokens_per_action))
                    for _ in range(self.horizon - 1)]
    # Drawn after the strings: a cue-less task's strings stay what they were.
    self.good = self.rng.choice(ARMS) if self.cue else "left"
    self.noise_rng = noise_rng("delayed", seed, self.session, self.crn, self.draw_seed)
    self.arm = None
    first = f"sign {self.good}: left or right?" if self.cue else "left or right?"
    return Reset("delayed: pick an arm; it pays at the end.", first)

  def _step(self, action: str) -> Step:
    a, t = action.strip(), self.turn
    if t == 0:
      invalid = a not in ARMS
      # Anything that is not an arm plays the free one (the arm that is not good).
      self.arm = a if a in ARMS else next(x for x in ARMS if x != self.good)
      reward = (-self.cost if self.arm == self.good else 0.0) - self._penalty(invalid)
      return Step(f"say {self.strings[0]}", reward, False, False, {"invalid_action": invalid})
    invalid = a != self.strings[t - 1]
    reward = self.noise * self.noise_rng.choice((-1.0, 1.0)) - self._penalty(invalid)
    if t < self.horizon - 1:
      return Step(f"say {self.strings[t]}", reward, False, False, {"invalid_action": invalid})
    paid = self.noise_rng.random() < (self.p_good if self.arm == self.good else self.p_bad)
    return Step("paid" if paid else "unpaid", reward + (1.0 if paid else 0.0), True, False,
                {"invalid_action": invalid, "success": paid})

  def _penalty(self, invalid: bool) -> float:
    return self.invalid_penalty if invalid else 0.0

  def redraw(self, seed: int) -> None:
    """Fresh noise and payoff for the turns not played yet (the lab's forks): all drawn as it goes."""
    self.noise_rng = random.Random(seed)

  @staticmethod
  def first_decision(action: str, observation: str | None = None) -> str:
    """The arm (no sign in `observation`), or whether it is the one the sign shows (`cue`).

    Anything that is not an arm plays the free arm, as `step` does: `right`, or the uncued one.
    """
    sign = _SIGN.search(observation or "")
    if sign is None:
      return "left" if action.strip() == "left" else "right"
    return CUED if action.strip() == sign.group(1).lower() else UNCUED

  def decision_value(self, turn: int, decision: str) -> float | None:
    # The noise averages 0 and the payoff depends only on the arm; a format penalty makes the
    # return depend on the later replies too (no closed form).
    if self.invalid_penalty:
      return None
    good = decision == (CUED if self.cue else "left")
    return (self.p_good if good else self.p_bad) - (self.cost if good and turn == 0 else 0.0)

  def state_key(self) -> str:
    """Turn and arm (the strings are the task's; the noise is never seen before it pays); with a cue,
    the arm as cued or not (the sign is the task's, what matters is whether the arm follows it)."""
    if self.arm is None:
      return "t0"
    return f"t{self.turn}:{(CUED if self.arm == self.good else UNCUED) if self.cue else self.arm}"

  # -- scripted policies ----------------------------------------------------

  def expert_action(self) -> str:
    return self.good if self.turn == 0 else self.strings[self.turn - 1]

  def suboptimal_action(self, rng: random.Random) -> str:
    """The tempting mistake: the free arm (the uncued one). Later turns stay expert-like."""
    return next(x for x in ARMS if x != self.good) if self.turn == 0 else self.expert_action()

  def random_action(self, rng: random.Random) -> str:
    if self.turn == 0:
      return rng.choice(ARMS)
    wrong = "".join(rng.choice(ECHO_SYMBOLS) for _ in range(self.tokens_per_action))
    return rng.choice((self.strings[self.turn - 1], wrong))

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    if self.cue:
      return ("You stand at a fork with two paths, left and right. A sign names one of them: that path "
              f"costs {self.cost:g} points at once, the other is free. Then you copy some strings of letters "
              "exactly. At the end your path may pay 1 point; one path pays far more often than the other. "
              "Reply with only the word or the string asked for.")
    return (f"You stand at a fork with two paths, left and right. Taking left costs {self.cost:g} points "
            "at once, right is free. Then you copy some strings of letters exactly. At the end your path "
            "may pay 1 point; one path pays far more often than the other. Reply with only the word or "
            "the string asked for.")

  def natural_observation(self, terse: str, step) -> str:
    if step is None:
      if self.cue:
        return f"A sign says the {self.good} path pays. Which path do you take: left or right?"
      return "Which path do you take: left or right?"
    if step.terminated:
      return "Your path paid 1 point!" if step.info.get("success") else "Your path paid nothing."
    return f"Copy this string: {self.strings[self.turn - 1]}"

  def natural_action(self, reply: str) -> str:
    if self.turn == 0:
      return pick_option(reply, ARMS) or reply.strip()
    return pick_option(reply, (self.strings[self.turn - 1],)) or reply.strip()
