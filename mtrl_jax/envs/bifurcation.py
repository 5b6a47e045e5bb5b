"""`bifurcation`: a two-armed choice whose payoff arrives `length` turns later, through noise.

The credit-assignment probe with nothing else to learn. Turn 0 picks an arm:
`left` costs `cost` at once and pays +1.0 at the end with probability
`p_good`; `right` is free and pays +1.0 with probability `p_bad`. Then
`length` distractor turns (echo the shown letter, as in `memory`), each paying
a random `+-noise` that no action influences, and a last turn (`done`) that
collects the payoff. Nothing the agent sees after turn 0 tells the arms apart
except its own first action, so all the credit for the outcome belongs to that
one token, `length + 1` turns before the reward:

  reset -> "left or right?"
  left  -> "say q"      (reward -cost)
  q     -> "say m"      (reward +-noise)
  m     -> "done?"      (reward +-noise)
  done  -> "paid"       (reward +1.0 with prob p_good, terminated; success = paid)

Expected return: left `p_good - cost`, right `p_bad` (defaults 0.85 vs 0.3).
An estimator that discounts, or bootstraps from a critic that cannot tell the
arms apart, sees the immediate cost and the noise more clearly than the payoff.
Unlike `memory` there is no recall to learn: a tiny model learns the format
from demos in a few hundred steps, and RL's only job is the turn-0 choice.
"""
from __future__ import annotations

import random

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.memory import ECHO_SYMBOLS
from mtrl_jax.envs.registry import register

ARMS = ("left", "right")


@register("bifurcation")
class Bifurcation(Env):
  """Pick an arm, echo `length` letters through reward noise, collect the arm's payoff."""

  def __init__(self, length: int = 4, cost: float = 0.1, p_good: float = 0.95, p_bad: float = 0.3,
               noise: float = 0.1, invalid_penalty: float = 0.0, style: str = "terse"):
    """
    Args:
      length: distractor turns between the choice and the payoff (>= 0).
      cost: paid (as -cost) at once for the good arm (`left`), >= 0.
      p_good / p_bad: payoff probability of `left` / `right`, in [0, 1].
      noise: each distractor turn pays +noise or -noise with equal odds (>= 0).
      invalid_penalty: paid (as -invalid_penalty) for every invalid action (an
        arm that is neither left nor right, a wrong echo, a last reply other than
        `done`). Nothing else rewards the format after turn 0, and RL drifts it
        (empty replies) while the noise pushes the echo tokens at random.
      style: 'terse' (the byte model's protocol) or 'natural' (English, as
        much said as the terse prompt: which arm pays better is for RL to find).
    """
    if length < 0:
      raise ValueError(f"bifurcation: length must be >= 0, got {length}")
    if cost < 0 or noise < 0:
      raise ValueError(f"bifurcation: cost and noise must be >= 0, got cost={cost}, noise={noise}")
    for name, p in (("p_good", p_good), ("p_bad", p_bad)):
      if not 0.0 <= p <= 1.0:
        raise ValueError(f"bifurcation: {name} must be in [0, 1], got {p}")
    if invalid_penalty < 0:
      raise ValueError(f"bifurcation: invalid_penalty must be >= 0, got {invalid_penalty}")
    self.length, self.cost, self.noise = length, float(cost), float(noise)
    self.invalid_penalty = float(invalid_penalty)
    self.p_good, self.p_bad = float(p_good), float(p_bad)
    self.style = check_style("bifurcation", style)
    self.max_turns = length + 2

  def _cue(self, t: int) -> str:
    return f"say {self.tokens[t - 1]}" if t <= self.length else "done?"

  def _reset(self, seed: int) -> Reset:
    self.tokens = [self.rng.choice(ECHO_SYMBOLS) for _ in range(self.length)]
    # Drawn at reset, whatever the arm: the same seed then gives both arms the
    # same noise and the same uniform draw (common random numbers for the lab).
    self.signs = [self.rng.choice((-1.0, 1.0)) for _ in range(self.length)]
    self.draw = self.rng.random()
    self.arm = None
    return Reset("bifurcation: pick an arm; it pays at the end.", "left or right?")

  def _step(self, action: str) -> Step:
    a = action.strip()
    t = self.turn
    if t == 0:
      invalid = a not in ARMS
      self.arm = "left" if a == "left" else "right"  # anything else counts as the free arm
      reward = -self.cost if self.arm == "left" else 0.0
      return Step(self._cue(1), reward - self._penalty(invalid), False, False, {"invalid_action": invalid})
    if t <= self.length:
      invalid = a != self.tokens[t - 1]
      return Step(self._cue(t + 1), self.noise * self.signs[t - 1] - self._penalty(invalid), False, False,
                  {"invalid_action": invalid})
    p = self.p_good if self.arm == "left" else self.p_bad
    paid = self.draw < p
    invalid = a != "done"
    return Step("paid" if paid else "unpaid", (1.0 if paid else 0.0) - self._penalty(invalid), True, False,
                {"invalid_action": invalid, "success": paid})

  def redraw(self, seed: int) -> None:
    """Fresh noise for the turns not played yet and a fresh payoff draw (the lab's forks
    marginalise over them: the policy never sees them before they pay)."""
    self.rng = random.Random(seed)
    start = max(self.turn - 1, 0)  # signs[t - 1] pays turn t
    self.signs[start:] = [self.rng.choice((-1.0, 1.0)) for _ in self.signs[start:]]
    self.draw = self.rng.random()

  def _penalty(self, invalid: bool) -> float:
    return self.invalid_penalty if invalid else 0.0

  @staticmethod
  def first_decision(action: str) -> str:
    return "left" if action.strip() == "left" else "right"  # anything else plays the free arm

  def decision_value(self, turn: int, decision: str) -> float | None:
    # The payoff depends only on the arm, the noise averages 0, the cost is paid at turn 0.
    # With a format penalty the return also depends on the policy's later replies: no closed form.
    if self.invalid_penalty:
      return None
    p = self.p_good if decision == "left" else self.p_bad
    return p - (self.cost if decision == "left" and turn == 0 else 0.0)

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    return (f"You stand at a fork with two paths, left and right. Taking left costs {self.cost:g} points "
            "at once, right is free. Then you answer a few simple questions. At the end your path may pay "
            "1 point; one path pays far more often than the other. Always reply with a single word.")

  def natural_observation(self, terse: str, step) -> str:
    t = self.turn
    if step is None:
      return "Which path do you take: left or right?"
    if t <= self.length:
      return f"Say the letter {self.tokens[t - 1]}."
    if t == self.length + 1:
      return "Say done to reach the end of the path."
    return "Your path paid 1 point!" if step.info.get("success") else "Your path paid nothing."

  def natural_action(self, reply: str) -> str:
    t = self.turn
    options = ARMS if t == 0 else (self.tokens[t - 1],) if t <= self.length else ("done",)
    return pick_option(reply, options) or reply.strip()

  def state_key(self) -> str:
    """Turn and arm (the noise and the payoff draw are fixed by the seed)."""
    return "t0" if self.arm is None else f"t{self.turn}:{self.arm}"

  def expert_action(self) -> str:
    t = self.turn
    if t == 0:
      return "left"
    return self.tokens[t - 1] if t <= self.length else "done"

  def suboptimal_action(self, rng: random.Random) -> str:
    """The tempting mistake: the free arm. Later turns stay expert-like."""
    return "right" if self.turn == 0 else self.expert_action()

  def random_action(self, rng: random.Random) -> str:
    t = self.turn
    if t == 0:
      return rng.choice(ARMS)
    if t <= self.length:
      return rng.choice((self.tokens[t - 1], rng.choice(ECHO_SYMBOLS)))
    return "done"
