"""`keydoor`: walk to the key, `pick` it up, walk next to the door, `open` it.

The only reward is +1.0 for opening the door while holding the key, so every
step before it earns nothing: a sparse, delayed-reward navigation task whose
difficulty grows with `size`. `corridor=True` makes it a 1 x size corridor;
`view=r` shows only the (2r+1) x (2r+1) window around the agent.

Observation (size 5, full view): the grid, one row a line, then the key flag.
  ..k..
  .A...
  .....
  ....D
  .....
  key 0
Legend: A agent, k key, D door, . floor, # outside the grid (partial view).
Actions: up, down, left, right, pick, open.
"""
from __future__ import annotations

import collections
import random
import re

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.registry import register

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ACTIONS = tuple(MOVES) + ("pick", "open")


@register("keydoor")
class KeyDoor(Env):
  """Pick up the key, then open the door, on a small grid or corridor."""

  def __init__(self, size: int = 5, corridor: bool = False, view: int | None = None,
               max_turns: int | None = None, style: str = "terse"):
    """
    Args:
      size: grid side (or corridor length); distances grow with it.
      corridor: a 1 x size corridor instead of a size x size grid.
      view: None for the full grid, r >= 1 for a (2r+1)-wide window (partial
        observability).
      max_turns: horizon; default 4 * size + 4 (the expert needs at most about
        2 * (rows + cols) + 2).
      style: 'terse' (the byte model's protocol) or 'natural' (English
        prompt and a legend with the map; the map itself is the same).
    """
    if size < 3:
      raise ValueError(f"keydoor: size must be >= 3, got {size}")
    if view is not None and view < 1:
      raise ValueError(f"keydoor: view must be None or >= 1, got {view}")
    self.rows, self.cols = (1, size) if corridor else (size, size)
    self.view = view
    self.style = check_style("keydoor", style)
    self.max_turns = max_turns if max_turns is not None else 4 * size + 4

  def _reset(self, seed: int) -> Reset:
    cells = [(r, c) for r in range(self.rows) for c in range(self.cols)]
    self.agent, self.key, self.door = self.rng.sample(cells, 3)
    if self.rows == 1:
      # In a corridor the door must not stand between the agent and the key.
      lo, mid, hi = sorted((self.agent, self.key, self.door))
      self.door, (self.agent, self.key) = (lo, (mid, hi)) if self.rng.random() < 0.5 else (hi, (lo, mid))
      if self.rng.random() < 0.5:
        self.agent, self.key = self.key, self.agent
    self.has_key = False
    prompt = "keydoor: pick the key k, open the door D. up down left right pick open"
    return Reset(prompt, self._render())

  def _render(self) -> str:
    def cell(r, c):
      if not (0 <= r < self.rows and 0 <= c < self.cols):
        return "#"
      if (r, c) == self.agent:
        return "A"
      if (r, c) == self.door:
        return "D"
      if not self.has_key and (r, c) == self.key:
        return "k"
      return "."
    if self.view is None:
      rows, cols = range(self.rows), range(self.cols)
    else:
      (ar, ac), v = self.agent, self.view
      rows = range(ar - v, ar + v + 1) if self.rows > 1 else range(0, 1)
      cols = range(ac - v, ac + v + 1)
    lines = ["".join(cell(r, c) for c in cols) for r in rows]
    return "\n".join(lines + [f"key {int(self.has_key)}"])

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    where = "a corridor" if self.rows == 1 else f"a {self.rows} by {self.cols} grid"
    seen = "the whole map" if self.view is None else f"only the cells within {self.view} steps of you"
    return (f"You are the A on {where}; you see {seen}. Walk onto the key k and pick it up, then stand "
            "next to the door D and open it: that earns 1 point. Moves: up, down, left, right; pick takes "
            "the key, open opens the door. Reply with one of: up, down, left, right, pick, open.")

  def natural_observation(self, terse: str, step) -> str:
    if step is not None and step.terminated:
      return "The door is open!"
    grid = terse.rsplit("\n", 1)[0]
    held = "You hold the key." if self.has_key else "You do not have the key yet."
    oops = " That move did nothing." if step is not None and step.info.get("invalid_action") else ""
    return f"Map (A you, k key, D door, . floor, # outside):\n{grid}\n{held}{oops} Your move?"

  def natural_action(self, reply: str) -> str:
    if re.search(r"\bpick(ed|s)?\s+(it\s+)?up\b", reply.lower()):
      return "pick"  # "pick up the key": not a move up
    return pick_option(reply, ACTIONS) or reply.strip()

  def state_key(self) -> str:
    """Where the agent stands and whether it holds the key (no turn index: a cell
    visited twice is the same state, GiGPO's repeated anchor states)."""
    return f"{self.agent[0]},{self.agent[1]}:{int(self.has_key)}"

  def _adjacent(self, a, b) -> bool:
    return abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1

  def _step(self, action: str) -> Step:
    a = action.strip()
    invalid = False
    if a in MOVES:
      dr, dc = MOVES[a]
      nxt = (self.agent[0] + dr, self.agent[1] + dc)
      if 0 <= nxt[0] < self.rows and 0 <= nxt[1] < self.cols and nxt != self.door:
        self.agent = nxt
      else:
        invalid = True
    elif a == "pick":
      if not self.has_key and self.agent == self.key:
        self.has_key = True
      else:
        invalid = True
    elif a == "open":
      if self.has_key and self._adjacent(self.agent, self.door):
        return Step("open", 1.0, True, False, {"invalid_action": False, "success": True})
      invalid = True
    else:
      invalid = True
    return Step(self._render(), 0.0, False, False, {"invalid_action": invalid})

  def _path_first_move(self, goal_test) -> str | None:
    """BFS over cells (the door blocks); the first move towards a goal cell."""
    start = self.agent
    parents = {start: None}
    queue = collections.deque([start])
    while queue:
      cur = queue.popleft()
      if goal_test(cur):
        moves = []
        while parents[cur] is not None:
          cur, move = parents[cur]
          moves.append(move)
        return moves[-1] if moves else None
      for move, (dr, dc) in MOVES.items():
        nxt = (cur[0] + dr, cur[1] + dc)
        if (0 <= nxt[0] < self.rows and 0 <= nxt[1] < self.cols and nxt != self.door
            and nxt not in parents):
          parents[nxt] = (cur, move)
          queue.append(nxt)
    return None

  def expert_action(self) -> str:
    if not self.has_key:
      if self.agent == self.key:
        return "pick"
      return self._path_first_move(lambda p: p == self.key) or "pick"
    if self._adjacent(self.agent, self.door):
      return "open"
    return self._path_first_move(lambda p: self._adjacent(p, self.door)) or "open"

  def random_action(self, rng: random.Random) -> str:
    return rng.choice(ACTIONS)
