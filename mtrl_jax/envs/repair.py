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

from mtrl_jax.envs.base import Env, Reset, Step
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
               partial_credit: bool = False, max_turns: int | None = None):
    """
    Args:
      length: program lines.
      bugs: mutated lines (<= length).
      num_tests: hidden test inputs judged at submit.
      visible_tests: how many of them `run` shows (<= num_tests).
      partial_credit: submit pays the pass fraction instead of all-or-nothing.
      max_turns: horizon; default 2 * bugs + 6 (the expert needs bugs + 2).
    """
    if not 1 <= bugs <= length:
      raise ValueError(f"repair: need 1 <= bugs <= length, got bugs={bugs}, length={length}")
    if not 1 <= visible_tests <= num_tests <= 10:
      raise ValueError(f"repair: need 1 <= visible_tests <= num_tests <= 10, "
                       f"got {visible_tests}, {num_tests}")
    self.length, self.bugs = length, bugs
    self.num_tests, self.visible_tests = num_tests, visible_tests
    self.partial_credit = partial_credit
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
