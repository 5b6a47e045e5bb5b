"""`cashout`: the policy decides when the episode ends (the early-exit probe).

Every turn offers a way out. Turns 0..length-1 show a letter: echoing it
carries on, `stop` ends the episode at once and pays `cash` (the cash-out).
After `length` echoes a last turn (`done`) collects the payoff: +1.0 with
probability `p_pay` (drawn at reset, so the same for a task's group).

  reset -> "say q or stop"
  q     -> "say m or stop"
  stop  -> "cashed out"          (reward +cash, terminated)
  ...   -> "done?"
  done  -> "paid"                (reward +1.0 with prob p_pay, terminated; success = paid)

With the defaults (cash 0.3 < p_pay 0.9) carrying on is always right, and
the advantage of every `stop` is negative. The probe exists for a bias of
per-turn-index normalisation (verl issue #7244): a late turn index exists
only in the sessions that carried on that far, so a reward that arrives
there is compared only with other sessions that also carried on, never with
the cash-outs that decided against it. docs/lab.md measures it.

`info["early_exit"]` is True on a stop; `turn_reward` is the base class's
(1 for an accepted action: the right letter, `stop`, `done`).
"""
from __future__ import annotations

import random

from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.envs.memory import ECHO_SYMBOLS
from mtrl_jax.envs.registry import register


@register("cashout")
class Cashout(Env):
  """Echo letters to carry on or `stop` to cash out; the payoff comes at the end."""

  def __init__(self, length: int = 4, cash: float = 0.3, p_pay: float = 0.9):
    """
    Args:
      length: turns offering the cash-out before the payoff turn (>= 1).
      cash: reward of a `stop` (>= 0).
      p_pay: probability that reaching the end pays +1.0, in [0, 1].
    """
    if length < 1:
      raise ValueError(f"cashout: length must be >= 1, got {length}")
    if cash < 0:
      raise ValueError(f"cashout: cash must be >= 0, got {cash}")
    if not 0.0 <= p_pay <= 1.0:
      raise ValueError(f"cashout: p_pay must be in [0, 1], got {p_pay}")
    self.length, self.cash, self.p_pay = length, float(cash), float(p_pay)
    self.max_turns = length + 1

  def _cue(self, t: int) -> str:
    return f"say {self.tokens[t]} or stop" if t < self.length else "done?"

  def _reset(self, seed: int) -> Reset:
    self.tokens = [self.rng.choice(ECHO_SYMBOLS) for _ in range(self.length)]
    self.draw = self.rng.random()  # at reset: a task's sessions share their luck (as bifurcation)
    return Reset("cashout: echo to go on, stop to cash out; the end pays more.", self._cue(0))

  def _step(self, action: str) -> Step:
    a = action.strip()
    t = self.turn
    if t < self.length:
      if a == "stop":
        return Step("cashed out", self.cash, True, False,
                    {"invalid_action": False, "success": False, "early_exit": True})
      return Step(self._cue(t + 1), 0.0, False, False, {"invalid_action": a != self.tokens[t]})
    paid = self.draw < self.p_pay
    return Step("paid" if paid else "unpaid", 1.0 if paid else 0.0, True, False,
                {"invalid_action": a != "done", "success": paid})

  def state_key(self) -> str:
    """The turn: a session still running at turn t is in the same state as any other."""
    return f"t{self.turn}"

  def expert_action(self) -> str:
    t = self.turn
    return self.tokens[t] if t < self.length else "done"

  def suboptimal_action(self, rng: random.Random) -> str:
    """The tempting mistake: cash out now (the payoff turn has no way out)."""
    return "stop" if self.turn < self.length else self.expert_action()

  def random_action(self, rng: random.Random) -> str:
    t = self.turn
    if t < self.length:
      return rng.choice(("stop", self.tokens[t], rng.choice(ECHO_SYMBOLS)))
    return "done"
