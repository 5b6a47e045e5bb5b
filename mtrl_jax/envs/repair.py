"""`repair`: fix a buggy program with tools (SWE style, nothing executed for real).

The program is written in a made-up accumulator language that Python
interprets: the accumulator starts at the input x, each line applies one
operation (`add k`, `sub k`, `mul k`), the result is the final accumulator.
`bugs` lines were mutated (an operator swapped or a constant changed); tests
compare the output with the original program's on a few inputs.

Actions (short on purpose):
  view            -> the program, one "n op k" a line
  run             -> visible tests: "pass 1/3 f(2)=9 want 11" or "pass 3/3"
  e<n> <op> <k>   -> replace line n (1-based), e.g. "e2 add 3"; "edit 2 add 3" also works
  submit          -> hidden tests decide: reward 1.0 if all pass (or the pass
                     fraction with partial_credit=True); the episode ends
"""
from __future__ import annotations

import random
import re

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.registry import register

OPS = ("add", "sub", "mul")
CONSTS = {"add": range(1, 10), "sub": range(1, 10), "mul": range(2, 4)}
_EDIT = re.compile(r"^(?:e|edit\s+)(\d+)\s+(add|sub|mul)\s+(\d+)$")


def run_program(lines: list[tuple[str, int]], x: int) -> int:
  acc = x
  for op, k in lines:
    acc = acc + k if op == "add" else acc - k if op == "sub" else acc * k
  return acc


@register("repair")
class Repair(Env):
  """View, test, edit and submit a short program with injected bugs."""

  def __init__(self, length: int = 4, bugs: int = 1, num_tests: int = 5, visible_tests: int = 3,
               partial_credit: bool = False, max_turns: int | None = None, style: str = "terse"):
    """
    Args:
      length: program lines.
      bugs: mutated lines (<= length).
      num_tests: hidden test inputs judged at submit.
      visible_tests: how many of them `run` shows (<= num_tests).
      partial_credit: submit pays the pass fraction instead of all-or-nothing.
      max_turns: horizon; default 2 * bugs + 6 (the expert needs bugs + 2).
      style: 'terse' (the byte model's protocol) or 'natural' (English).
    """
    if not 1 <= bugs <= length:
      raise ValueError(f"repair: need 1 <= bugs <= length, got bugs={bugs}, length={length}")
    if not 1 <= visible_tests <= num_tests <= 10:
      raise ValueError(f"repair: need 1 <= visible_tests <= num_tests <= 10, "
                       f"got {visible_tests}, {num_tests}")
    self.length, self.bugs = length, bugs
    self.num_tests, self.visible_tests = num_tests, visible_tests
    self.partial_credit = partial_credit
    self.style = check_style("repair", style)
    self.max_turns = max_turns if max_turns is not None else 2 * bugs + 6

  def _random_line(self, rng: random.Random) -> tuple[str, int]:
    op = rng.choice(OPS)
    return op, rng.choice(CONSTS[op])

  def _mutate(self, line: tuple[str, int]) -> tuple[str, int]:
    op, k = line
    if op in ("add", "sub") and self.rng.random() < 0.5:
      return ("sub" if op == "add" else "add"), k
    return op, self.rng.choice([c for c in CONSTS[op] if c != k])

  def _reset(self, seed: int) -> Reset:
    rng = self.rng
    self.target = [self._random_line(rng) for _ in range(self.length)]
    self.inputs = rng.sample(range(10), self.num_tests)
    while True:  # a bug must show on the visible tests, or `run` could not find it
      self.program = list(self.target)
      for i in rng.sample(range(self.length), self.bugs):
        self.program[i] = self._mutate(self.program[i])
      if self._passed(self.visible_tests)[0] < self.visible_tests:
        break
    self.viewed = False
    prompt = "repair: view, run, e<n> <op> <k>, submit. acc=x; ops add sub mul"
    return Reset(prompt, f"{self.length} lines, tests fail")

  def _passed(self, n: int) -> tuple[int, str]:
    """(passed count over the first n tests, first failure as text)."""
    passed, first = 0, ""
    for x in self.inputs[:n]:
      got, want = run_program(self.program, x), run_program(self.target, x)
      if got == want:
        passed += 1
      elif not first:
        first = f" f({x})={got} want {want}"
    return passed, first

  def _step(self, action: str) -> Step:
    a = " ".join(action.split())
    if a == "view":
      self.viewed = True
      text = "\n".join(f"{i + 1} {op} {k}" for i, (op, k) in enumerate(self.program))
      return Step(text, 0.0, False, False, {})
    if a == "run":
      passed, first = self._passed(self.visible_tests)
      return Step(f"pass {passed}/{self.visible_tests}{first}", 0.0, False, False, {})
    if a == "submit":
      passed, _ = self._passed(self.num_tests)
      ok = passed == self.num_tests
      reward = passed / self.num_tests if self.partial_credit else float(ok)
      return Step(f"pass {passed}/{self.num_tests}", reward, True, False, {"success": ok})
    m = _EDIT.match(a)
    if m:
      n, op, k = int(m.group(1)), m.group(2), int(m.group(3))
      if 1 <= n <= self.length and k in CONSTS[op]:
        self.program[n - 1] = (op, k)
        return Step("ok", 0.0, False, False, {})
      return Step("bad edit", 0.0, False, False, {"invalid_action": True})
    return Step("bad action", 0.0, False, False, {"invalid_action": True})

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    return ("Fix a buggy program. It starts from the input x and applies one operation per line: add k, "
            "sub k or mul k. Some lines are wrong. Commands: view shows the program, run runs the visible "
            "tests, e<n> <op> <k> replaces line n (for example e2 add 3), submit ends the task and the "
            "hidden tests decide (1 point if all pass). Reply with one command.")

  def natural_observation(self, terse: str, step) -> str:
    if step is None:
      return f"The program has {self.length} lines and some tests fail. Your command?"
    a = " ".join(self.actions[-1].split()) if self.actions else ""
    if step.terminated:
      return f"Submitted: {terse.removeprefix('pass ')} hidden tests pass."
    if terse.startswith("pass "):  # run
      m = re.match(r"pass (\d+)/(\d+)(?: f\((\d+)\)=(-?\d+) want (-?\d+))?", terse)
      text = f"{m.group(1)} of {m.group(2)} visible tests pass."
      if m.group(3) is not None:
        text += f" For x={m.group(3)} the program gives {m.group(4)}, expected {m.group(5)}."
      return text + " Your command?"
    if terse in ("ok", "bad edit", "bad action"):
      return {"ok": "Line replaced.", "bad edit": "That edit is not allowed.",
              "bad action": f"Unknown command {a!r}."}[terse] + " Your command?"
    return f"The program:\n{terse}\nYour command?"  # view

  def natural_action(self, reply: str) -> str:
    text = " ".join(reply.strip().strip(" .`'\"").lower().split())
    if text in ("view", "run", "submit") or _EDIT.match(text):
      return text
    edits = re.findall(r"\b(?:e|edit\s+)(?:line\s+)?(\d+)\s+(add|sub|mul)\s+(\d+)\b", text)
    if len(edits) == 1:
      return f"e{edits[0][0]} {edits[0][1]} {edits[0][2]}"
    return pick_option(text, ("view", "run", "submit")) or reply.strip()

  def expert_action(self) -> str:
    if not self.viewed:
      return "view"
    for i, (cur, want) in enumerate(zip(self.program, self.target)):
      if cur != want:
        return f"e{i + 1} {want[0]} {want[1]}"
    return "submit"

  def random_action(self, rng: random.Random) -> str:
    kind = rng.choice(("view", "run", "submit", "edit"))
    if kind != "edit":
      return kind
    op, k = self._random_line(rng)
    return f"e{rng.randint(1, self.length)} {op} {k}"
