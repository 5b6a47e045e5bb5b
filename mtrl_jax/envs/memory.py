"""`memory`: the credit-assignment probe.

Turn 0 is the decisive choice: `peek` costs `peek_cost` and reveals a secret
code (one of `num_codes` symbols), `skip` is free and reveals nothing. Then
`length` distractor turns (echo the shown letter; nothing rides on them), then
the question: answering the code gives +1.0. Without peeking the agent can
only guess (success 1/num_codes). The good first action pays off only
`length + 1` turns later, at a price paid immediately: discounted or lambda < 1
credit sees the cost and under-weights the payoff; full-episode credit does not.

  reset -> "peek or skip?"
  peek  -> "code 7 say q"      (reward -0.05)
  q     -> "say m"
  m     -> "answer?"
  7     -> "right"             (reward +1.0, terminated, success)
"""
from __future__ import annotations

import random
import string

from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.envs.registry import register

CODE_SYMBOLS = string.digits + string.ascii_uppercase   # codes: 0-9, then A-Z
ECHO_SYMBOLS = string.ascii_lowercase                   # distractor tokens


@register("memory")
class Memory(Env):
  """Peek-or-skip, `length` distractor turns, then recall the code."""

  def __init__(self, length: int = 3, num_codes: int = 10, peek_cost: float = 0.05,
               distractor: str = "echo", hint: bool = False, code_alphabet: str = "digits"):
    """
    Args:
      length: distractor turns between the choice and the question (>= 0).
      num_codes: size of the code alphabet.
      code_alphabet: 'digits' (0-9 then A-Z, up to 36 codes) or 'letters'
        (a-z, the alphabet of the echo distractors: the recall reuses the
        copying the distractor turns already teach).
      peek_cost: reward paid (as -peek_cost) for peeking.
      distractor: 'echo' (repeat the shown letter) or 'wait' (any action is fine).
      hint: if the agent peeked, the final question repeats the code. The
        turn-0 choice still decides the outcome `length + 1` turns later (the
        credit question), but recall over the distractors is not needed: for
        models too small to learn long-range copying in minutes.
    """
    if length < 0:
      raise ValueError(f"memory: length must be >= 0, got {length}")
    alphabets = {"digits": CODE_SYMBOLS, "letters": ECHO_SYMBOLS}
    if code_alphabet not in alphabets:
      raise ValueError(f"memory: code_alphabet must be one of {sorted(alphabets)}, got {code_alphabet!r}")
    symbols = alphabets[code_alphabet]
    if not 2 <= num_codes <= len(symbols):
      raise ValueError(f"memory: num_codes must be in [2, {len(symbols)}] for code_alphabet="
                       f"{code_alphabet!r}, got {num_codes}")
    if distractor not in ("echo", "wait"):
      raise ValueError(f"memory: distractor must be 'echo' or 'wait', got {distractor!r}")
    self.length = length
    self.codes = symbols[:num_codes]
    self.peek_cost = float(peek_cost)
    self.distractor = distractor
    self.hint = bool(hint)
    self.max_turns = length + 2

  def _cue(self, t: int) -> str:
    """What turn t (1 <= t <= length + 1) asks for."""
    if t <= self.length:
      return f"say {self.tokens[t - 1]}" if self.distractor == "echo" else "wait"
    return f"answer? {self.code}" if self.hint and self.peeked else "answer?"

  def _reset(self, seed: int) -> Reset:
    self.code = self.rng.choice(self.codes)
    self.tokens = [self.rng.choice(ECHO_SYMBOLS) for _ in range(self.length)]
    self.peeked = False
    # No digits in the prompt: the code is then the only digit (for
    # num_codes <= 10) a tiny byte-level model has to find and copy.
    prompt = "memory: peek shows a code; answer it at the end."
    return Reset(prompt, "peek or skip?")

  def _step(self, action: str) -> Step:
    a = action.strip()
    t = self.turn  # turns done before this one
    if t == 0:
      invalid = a not in ("peek", "skip")
      self.peeked = a == "peek"
      reveal = f"code {self.code}" if self.peeked else "no code"
      reward = -self.peek_cost if self.peeked else 0.0
      return Step(f"{reveal} {self._cue(1)}", reward, False, False, {"invalid_action": invalid})
    if t <= self.length:
      invalid = self.distractor == "echo" and a != self.tokens[t - 1]
      return Step(self._cue(t + 1), 0.0, False, False, {"invalid_action": invalid})
    correct = a == self.code
    info = {"invalid_action": a not in self.codes, "success": correct}
    return Step("right" if correct else "wrong", 1.0 if correct else 0.0, True, False, info)

  def state_key(self) -> str:
    """Turn and the peek choice: all that decides what comes next (the code and the
    distractor letters are fixed by the seed, so the same within a task group)."""
    return "t0" if self.turn == 0 else f"t{self.turn}:{'peek' if self.peeked else 'skip'}"

  def expert_action(self) -> str:
    t = self.turn
    if t == 0:
      return "peek"
    if t <= self.length:
      return self.tokens[t - 1] if self.distractor == "echo" else "ok"
    # Without the peek the code is unknown: the expert (after a suboptimal
    # skip) guesses, deterministically per episode.
    return self.code if self.peeked else self.codes[self.seed % len(self.codes)]

  def suboptimal_action(self, rng: random.Random) -> str:
    """The tempting mistake: save the peek cost at turn 0 (and then guess).

    Later turns stay expert-like, so low-quality demos teach the format and
    the recall, and leave the decisive choice for RL to fix.
    """
    return "skip" if self.turn == 0 else self.expert_action()

  def random_action(self, rng: random.Random) -> str:
    t = self.turn
    if t == 0:
      return rng.choice(("peek", "skip"))
    if t <= self.length:
      if self.distractor == "wait":
        return "ok"
      return rng.choice((self.tokens[t - 1], rng.choice(ECHO_SYMBOLS)))
    return rng.choice(self.codes)
