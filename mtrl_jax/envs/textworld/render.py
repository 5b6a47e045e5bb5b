"""What the agent reads of a TextWorld game, in the two styles, and how a reply becomes a command.

terse (for the byte model), at most `limit` characters a turn (default TERSE_CHARS):
    kitchen. exits: east, north(wooden door, closed). see: fridge(closed), table(knife).
    carry: purple potato(sliced).
    you take the knife from the table.
  the room, its exits (a door named with its state), the visible objects (on supporters, in
  open containers), what the player carries, then the game's last feedback compacted (a room
  description is dropped: the state lines already say it; the cookbook becomes one `recipe:`
  line; the end banner becomes `won` / `lost`). Everything comes from the game's logical
  facts, so it is exact and in a fixed order.
natural (for a pretrained chat model): the game's own text, with the ASCII banner, the
  restart question and runs of blank lines removed.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

TERSE_CHARS = 300  # the default upper bound on characters per terse observation
DIRECTIONS = ("north", "south", "east", "west")
# Food states worth showing on carried items (cooking): cut and cooked.
FOOD_STATES = ("sliced", "diced", "chopped", "fried", "roasted", "grilled", "burned")

_ROOM_HEADER = re.compile(r"^\s*-=\s*(.+?)\s*=-", re.M)
_RESTART = re.compile(r"Would you like to RESTART.*$", re.S)
_SCORE_UP = re.compile(r"Your score has just gone up by \w+ points?\.?")
# The interpreter's status line at the end of some replies: ">   -= Kitchen =-3/12" (score/moves).
_STATUS = re.compile(r"\s*>?\s*-=[^\n]*=-\s*-?\d+/\d+\s*$")


def strip_status(text: str) -> str:
  """The game's reply without the interpreter's trailing status line."""
  return _STATUS.sub("", text)


def _fact_parts(fact) -> tuple[str, list[tuple[str, str]]]:
  return fact.name, [(v.name, v.type) for v in fact.arguments]


class Facts:
  """The game's state as the few relations the terse view needs (from human-readable facts)."""

  def __init__(self, facts: Iterable):
    self.room = ""
    self.at: dict[str, list[str]] = {}
    self.on: dict[str, list[str]] = {}
    self.inside: dict[str, list[str]] = {}
    self.states: dict[str, set[str]] = {}
    self.exits: dict[str, str] = {}  # direction -> room (from the player's room)
    self.links: dict[tuple[str, str], str] = {}  # (room, room) -> door
    neighbours: list[tuple[str, str, str]] = []
    for fact in facts:
      name, args = _fact_parts(fact)
      if name == "at" and len(args) == 2:
        if args[0][1] == "P":
          self.room = args[1][0]
        else:
          self.at.setdefault(args[1][0], []).append(args[0][0])
      elif name == "on" and len(args) == 2:
        self.on.setdefault(args[1][0], []).append(args[0][0])
      elif name == "in" and len(args) == 2:
        self.inside.setdefault(args[1][0], []).append(args[0][0])
      elif name.endswith("_of") and name[:-3] in DIRECTIONS and len(args) == 2:
        neighbours.append((name[:-3], args[0][0], args[1][0]))  # north_of(a, b): a is north of b
      elif name == "link" and len(args) == 3:
        self.links[(args[0][0], args[2][0])] = args[1][0]
      elif len(args) == 1:
        self.states.setdefault(args[0][0], set()).add(name)
    for direction, there, here in neighbours:
      if here == self.room:
        self.exits[direction] = there

  def carried(self) -> list[str]:
    return sorted(self.inside.get("I", []))


def _is_open(facts: Facts, thing: str) -> bool:
  return "open" in facts.states.get(thing, set())


def _thing(facts: Facts, thing: str) -> str:
  """A visible thing with what it shows: table(knife), fridge(closed), fridge(lettuce)."""
  states = facts.states.get(thing, set())
  shown = sorted(facts.on.get(thing, []))
  if "closed" in states or "locked" in states:
    return f"{thing}({'locked' if 'locked' in states else 'closed'})"
  shown += sorted(facts.inside.get(thing, [])) if _is_open(facts, thing) else []
  return f"{thing}({', '.join(shown)})" if shown else thing


def state_lines(facts: Facts) -> str:
  exits = []
  for d in DIRECTIONS:
    if d in facts.exits:
      door = facts.links.get((facts.room, facts.exits[d]))
      if door is None:
        exits.append(d)
      else:
        st = facts.states.get(door, set())
        exits.append(f"{d}({door}, {'locked' if 'locked' in st else 'closed' if 'closed' in st else 'open'})")
  doors = set(facts.links.values())
  seen = [_thing(facts, t) for t in sorted(facts.at.get(facts.room, [])) if t not in doors]
  out = f"{facts.room}. exits: {', '.join(exits) or 'none'}."
  if seen:
    out += f" see: {', '.join(seen)}."
  carried = []
  for t in facts.carried():
    st = [s for s in FOOD_STATES if s in facts.states.get(t, set())]
    carried.append(f"{t}({' '.join(st)})" if st else t)
  if carried:
    out += f" carry: {', '.join(carried)}."
  return out


def compact_feedback(text: str) -> str:
  """The game's reply to the last command, in a line (see the module docstring)."""
  text = strip_status(text)
  if "*** The End ***" in text:
    return "won"
  if "*** You lost! ***" in text:
    return "lost"
  if "Ingredients:" in text and "Directions:" in text:
    ing = text.split("Ingredients:", 1)[1].split("Directions:", 1)[0]
    steps = text.split("Directions:", 1)[1]
    items = [" ".join(l.split()) for l in ing.splitlines() if l.strip()]
    todo = [" ".join(l.split()) for l in steps.splitlines() if l.strip()]
    return f"recipe: {', '.join(items)}. do: {', '.join(todo)}."
  if _ROOM_HEADER.search(text):
    return ""  # a room description (after a move or `look`): the state lines say it
  text = _SCORE_UP.sub("", text)
  return " ".join(text.split()).lower()


def terse(facts: Facts, feedback: str, limit: int = TERSE_CHARS) -> str:
  """The terse observation, at most `limit` characters: the feedback keeps at least half of
  the budget, the state lines the rest, each cut with '..' when longer."""
  state, fb = state_lines(facts), compact_feedback(feedback)
  if not fb:
    return _cut(state, limit)
  fb = _cut(fb, max(limit - len(state) - 1, limit // 2))
  return _cut(state, limit - len(fb) - 1) + "\n" + fb


def _cut(text: str, n: int) -> str:
  return text if len(text) <= n else text[:max(n - 2, 0)] + ".."


def natural(text: str) -> str:
  """The game's text for a chat model: banner, restart question and blank runs removed."""
  lines = strip_status(text).splitlines()
  while lines and not re.search(r"[A-Za-z]", lines[0]):
    lines.pop(0)  # the ASCII-art banner (and blank lines) before the first sentence
  text = _RESTART.sub("", "\n".join(l.rstrip() for l in lines))
  return re.sub(r"\n{3,}", "\n\n", text).strip()


def normalize(command: str) -> str:
  """A command as the game lists them: lower case, single spaces, no quotes or end punctuation."""
  c = command.strip().strip(" \t\n\r.,;:!?\"'`*()[]{}<>").lower()
  return " ".join(c.split())


def pick_command(reply: str, commands: Sequence[str]) -> str:
  """The admissible command a free-text reply names: the reply itself, else the longest
  command that appears in it as whole words (a tie between different commands of that length
  picks none); else the reply (an invalid command)."""
  text = normalize(reply.splitlines()[0] if reply.strip() else reply)
  cmds = {normalize(c): c for c in commands}
  if text in cmds:
    return cmds[text]
  flat = " " + " ".join(re.findall(r"[\w'-]+", reply.lower())) + " "
  found = [c for c in cmds if f" {c} " in flat]
  if found:
    longest = max(len(c) for c in found)
    top = [c for c in found if len(c) == longest]
    if len(top) == 1:
      return cmds[top[0]]
  return reply
