"""`revisit`: a slippery corridor whose states recur within and across sessions.

The probe where step groups (GiGPO, HGPO) differ from episode groups. Cells
0 .. size-1, start at 0, +1.0 for reaching the last cell (terminated,
success). Each turn says `left` or `right`; with probability `slip` the step
goes the other way (a wall at 0 keeps the agent there), and every turn pays a
zero-mean `+-noise`. Slips and noise are the *session's* draws (see
envs/session_noise.py; `crn=True` shares them across a task's sessions, for
the lab), so the sessions of a group part ways and come back: the same cell
(`state_key` "p<cell>", what the agent sees) recurs at other turns of the
same session and of its group-mates, and a step group gathers actions from
different turns and sessions.

  reset -> "at 0/3"
  right -> "at 1/3"     (reward +-noise)
  right -> "at 0/3"     (slipped; reward +-noise)
  ...   -> "goal"       (reward +-noise +1.0, terminated, success)

A session ends after `horizon` turns if it has not arrived. Values under a
policy that goes right with probability q are a small dynamic programme over
(cell, turns left) (`corridor_values`); the state key omits the turns left,
as GiGPO's anchor states do, so two actions in one step group agree on the
value exactly only while the horizon is far.
"""
from __future__ import annotations

import random

import numpy as np

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.registry import register
from mtrl_jax.envs.session_noise import noise_rng

MOVES = ("left", "right")


def corridor_values(size: int, horizon: int, slip: float, p_right: float) -> np.ndarray:
  """V[k, cell]: expected return with k turns left from `cell`, for a policy saying
  `right` with probability p_right (the noise averages 0; the goal cell is terminal, value 0).

  A turn moves right with probability r = p_right (1 - slip) + (1 - p_right) slip,
  else left (kept at 0 by the wall); arriving at size - 1 pays 1.
  """
  goal = size - 1
  r = p_right * (1.0 - slip) + (1.0 - p_right) * slip
  v = np.zeros((horizon + 1, size))
  for k in range(1, horizon + 1):
    for c in range(goal):
      up = (1.0 if c + 1 == goal else 0.0) + v[k - 1, c + 1]
      v[k, c] = r * up + (1.0 - r) * v[k - 1, max(c - 1, 0)]
  return v


@register("revisit")
class Revisit(Env):
  """Walk a slippery corridor to its last cell within `horizon` turns."""

  def __init__(self, size: int = 4, horizon: int = 8, slip: float = 0.2, noise: float = 0.1, crn: bool = False,
               invalid_penalty: float = 0.0, style: str = "terse"):
    """
    Args:
      size: cells in the corridor (>= 2); the goal is the last, the start the first.
      horizon: turns before the session is cut (>= 1).
      slip: probability that a step goes the other way, in [0, 0.5).
      noise: each turn pays +noise or -noise with equal odds, drawn per session (>= 0).
      crn: common random numbers: every session of a task draws the same slips and noise
        (for the lab); the default draws them per session.
      invalid_penalty: paid (as -invalid_penalty) for a reply that is neither left nor right
        (the agent stays where it is); >= 0.
      style: 'terse' (the byte model's protocol) or 'natural' (English).
    """
    if size < 2:
      raise ValueError(f"revisit: size must be >= 2, got {size}")
    if horizon < 1:
      raise ValueError(f"revisit: horizon must be >= 1, got {horizon}")
    if not 0.0 <= slip < 0.5:
      raise ValueError(f"revisit: slip must be in [0, 0.5), got {slip}")
    if noise < 0 or invalid_penalty < 0:
      raise ValueError(f"revisit: noise and invalid_penalty must be >= 0, got noise={noise}, "
                       f"invalid_penalty={invalid_penalty}")
    self.size, self.horizon, self.slip, self.noise = int(size), int(horizon), float(slip), float(noise)
    self.crn, self.invalid_penalty = bool(crn), float(invalid_penalty)
    self.style = check_style("revisit", style)
    self.max_turns = self.horizon

  def _obs(self) -> str:
    return f"at {self.pos}/{self.size - 1}"

  def _reset(self, seed: int) -> Reset:
    self.noise_rng = noise_rng("revisit", seed, self.session, self.crn)
    self.pos = 0
    return Reset("revisit: walk left or right to the last cell.", self._obs())

  def _step(self, action: str) -> Step:
    a = action.strip()
    invalid = a not in MOVES
    # Two draws every turn, whatever the action, so CRN sessions stay aligned.
    slipped = self.noise_rng.random() < self.slip
    reward = self.noise * self.noise_rng.choice((-1.0, 1.0)) - (self.invalid_penalty if invalid else 0.0)
    if not invalid:
      right = (a == "right") != slipped
      self.pos = min(self.pos + 1, self.size - 1) if right else max(self.pos - 1, 0)
    info = {"invalid_action": invalid, "slipped": bool(slipped and not invalid)}
    if self.pos == self.size - 1:
      return Step("goal", reward + 1.0, True, False, {**info, "success": True})
    return Step(self._obs(), reward, False, False, info)

  def redraw(self, seed: int) -> None:
    """Fresh slips and noise for the turns not played yet (the lab's forks)."""
    self.noise_rng = random.Random(seed)

  def state_key(self) -> str:
    """The cell (what the agent sees; not the turn, so states recur)."""
    return f"p{self.pos}"

  def state_value(self, p_right: float = 1.0) -> float:
    """Expected return from here on for a policy saying right with probability p_right."""
    if self.done:
      return 0.0
    return float(corridor_values(self.size, self.horizon, self.slip, p_right)[self.max_turns - self.turn, self.pos])

  # -- scripted policies ----------------------------------------------------

  def expert_action(self) -> str:
    return "right"

  def suboptimal_action(self, rng: random.Random) -> str:
    return "left"

  def random_action(self, rng: random.Random) -> str:
    return rng.choice(MOVES)

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    return (f"You walk a corridor of cells 0 to {self.size - 1}, starting at cell 0. Each turn, say left "
            f"or right. The floor is slippery: sometimes a step goes the other way. Reaching cell "
            f"{self.size - 1} pays 1 point. Always reply with a single word.")

  def natural_observation(self, terse: str, step) -> str:
    if step is not None and step.terminated:
      return "You reached the last cell and earned 1 point!"
    return f"You are in cell {self.pos}. Left or right?"

  def natural_action(self, reply: str) -> str:
    return pick_option(reply, MOVES) or reply.strip()
