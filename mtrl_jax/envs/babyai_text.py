"""The text a BabyAI agent reads: its partial view in words (pure functions of a numpy array).

minigrid encodes what the agent sees as a (view, view, 3) array of (object, colour, state)
indices, indexed [column, row], the agent at the bottom centre looking "up" the rows, the
object it carries drawn on its own cell, and 0 where it cannot see (behind walls, outside).
`read_view` turns that array into a `View`: the objects (colour, kind, door state) each at
(ahead, side) steps from the agent (side < 0: to its left), nearest first, and the nearest
wall straight ahead, to the left and to the right. Two renderings:

  terse (the byte model's; at most TERSE_MAX_CHARS characters a turn):
    wall f3 l1            nearest wall: 3 steps ahead, 1 step left (none seen right)
    red ball f2 r1        2 steps ahead, 1 to the right
    grey door f3 l2 locked
    carry blue key
  natural (sentences a pretrained chat model can read):
    You see a red ball 2 steps ahead and 1 step to the right, a locked grey door ...
    There is a wall 3 steps ahead and a wall 1 step to your left. You carry a blue key.

The terse list keeps the TERSE_MAX_OBJECTS nearest objects (a 7x7 view holds at most a
room's worth; more are dropped, farthest first) so its length has a hard bound.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# minigrid's encodings (minigrid/core/constants.py), copied so this file needs no minigrid.
OBJECTS = {0: "unseen", 1: "empty", 2: "wall", 3: "floor", 4: "door", 5: "key", 6: "ball",
           7: "box", 8: "goal", 9: "lava", 10: "agent"}
COLOURS = {0: "red", 1: "green", 2: "blue", 3: "purple", 4: "yellow", 5: "grey"}
DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}
_NOT_ITEMS = ("unseen", "empty", "wall", "floor", "agent")

TERSE_MAX_OBJECTS = 8
# Longest terse lines: "wall f6 l3 r3" (13), "purple ball f6 l3 locked" (24; only a door has a
# state, and "purple door f6 l3 locked" is as long), "carry purple ball" (17), "invalid" (7).
TERSE_MAX_CHARS = 13 + TERSE_MAX_OBJECTS * (1 + 24) + (1 + 17) + (1 + 7)  # = 239


class Item(NamedTuple):
  colour: str
  kind: str     # ball, box, key, door (goal, lava: not in BabyAI levels)
  state: str    # a door's open / closed / locked, else ""
  ahead: int    # steps ahead of the agent (0: level with it)
  side: int     # steps to its right (< 0: to its left)


class View(NamedTuple):
  items: tuple[Item, ...]            # nearest first
  wall_ahead: int | None             # steps to the nearest wall straight ahead (None: none seen)
  wall_left: int | None
  wall_right: int | None
  carrying: tuple[str, str] | None   # (colour, kind)


def read_view(image: np.ndarray) -> View:
  """The `View` of minigrid's encoded partial observation `image` (see the module doc)."""
  image = np.asarray(image)
  size = image.shape[0]
  if image.ndim != 3 or image.shape[1] != size or image.shape[2] != 3 or size % 2 == 0:
    raise ValueError(f"expected an odd square (view, view, 3) array, got shape {image.shape}")
  mid, last = size // 2, size - 1
  items = []
  for i in range(size):
    for j in range(size):
      if (i, j) == (mid, last):
        continue
      kind = OBJECTS.get(int(image[i, j, 0]), "unseen")
      if kind in _NOT_ITEMS:
        continue
      state = DOOR_STATES.get(int(image[i, j, 2]), "") if kind == "door" else ""
      items.append(Item(COLOURS.get(int(image[i, j, 1]), "grey"), kind, state, last - j, i - mid))
  items.sort(key=lambda it: (abs(it.ahead) + abs(it.side), it.ahead, it.side))

  def first_wall(cells) -> int | None:
    for steps, (i, j) in enumerate(cells, start=1):
      if OBJECTS.get(int(image[i, j, 0])) == "wall":
        return steps
    return None

  held = OBJECTS.get(int(image[mid, last, 0]), "empty")
  carrying = (COLOURS.get(int(image[mid, last, 1]), "grey"), held) if held not in _NOT_ITEMS else None
  return View(tuple(items),
              first_wall([(mid, j) for j in range(last - 1, -1, -1)]),
              first_wall([(i, last) for i in range(mid - 1, -1, -1)]),
              first_wall([(i, last) for i in range(mid + 1, size)]),
              carrying)


def _where_terse(ahead: int, side: int) -> str:
  out = f"f{ahead}"
  if side:
    out += f" {'r' if side > 0 else 'l'}{abs(side)}"
  return out


def terse(view: View, invalid: bool = False) -> str:
  """The byte model's rendering: one short line per fact (at most TERSE_MAX_CHARS characters)."""
  lines = []
  walls = [f"{d}{n}" for d, n in (("f", view.wall_ahead), ("l", view.wall_left), ("r", view.wall_right))
           if n is not None]
  if walls:
    lines.append("wall " + " ".join(walls))
  for it in view.items[:TERSE_MAX_OBJECTS]:
    lines.append(" ".join(x for x in (it.colour, it.kind, _where_terse(it.ahead, it.side), it.state)
                          if x and x != "closed"))
  if view.carrying:
    lines.append(f"carry {view.carrying[0]} {view.carrying[1]}")
  if invalid:
    lines.append("invalid")
  return "\n".join(lines) if lines else "nothing"


def _steps(n: int) -> str:
  return f"{n} step{'s' if n != 1 else ''}"


def _where_natural(ahead: int, side: int) -> str:
  parts = [f"{_steps(ahead)} ahead"] if ahead else []
  if side:
    parts.append(f"{_steps(abs(side))} to the {'right' if side > 0 else 'left'}")
  return " and ".join(parts) if parts else "here"


def _a(colour_kind: str) -> str:
  return ("an " if colour_kind[0] in "aeiou" else "a ") + colour_kind


def natural(view: View, invalid: bool = False) -> str:
  """Readable sentences of the same facts (every object seen, not only the nearest)."""
  out = []
  if view.items:
    seen = []
    for it in view.items:
      door = f"{it.state} " if it.kind == "door" else ""
      seen.append(f"{_a(door + it.colour + ' ' + it.kind)} {_where_natural(it.ahead, it.side)}")
    out.append("You see " + ", ".join(seen) + ".")
  else:
    out.append("You see no objects.")
  walls = [f"{_steps(n)} {where}" for n, where in ((view.wall_ahead, "ahead"), (view.wall_left, "to your left"),
                                                   (view.wall_right, "to your right")) if n is not None]
  if walls:
    out.append("There is a wall " + ", a wall ".join(walls) + ".")
  out.append(f"You carry {_a(' '.join(view.carrying))}." if view.carrying else "You carry nothing.")
  if invalid:
    out.append("That reply was not an action.")
  return " ".join(out)
