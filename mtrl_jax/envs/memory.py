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

style='natural' says the same in English for a pretrained chat model
("Do you want to peek at the secret code, or skip? ...", "The code is 7. Now
say the letter q.") and reads its replies leniently ("I will peek." is peek).
"""
from __future__ import annotations

import random
import string

from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.registry import register

CODE_SYMBOLS = string.digits + string.ascii_uppercase   # codes: 0-9, then A-Z
ECHO_SYMBOLS = string.ascii_lowercase                   # distractor tokens


@register("memory")
class Memory(Env):
  """Peek-or-skip, `length` distractor turns, then recall the code."""

  def __init__(self, length: int = 3, num_codes: int = 10, peek_cost: float = 0.05,
               distractor: str = "echo", hint: bool = False, code_alphabet: str = "digits",
               invalid_penalty: float = 0.0, style: str = "terse"):
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
      invalid_penalty: paid (as -invalid_penalty) for every invalid action (a wrong
        echo, a turn-0 reply that is neither peek nor skip, an answer outside the
        code alphabet). With an outcome-only reward nothing holds the echo turns
        in place: RL lets them drift, and the drift spoils the copy the final
        answer needs. The penalty keeps the format; the turn-0 choice still
        decides the outcome turns later.
      style: 'terse' (the byte model's protocol) or 'natural' (English).
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
    if invalid_penalty < 0:
      raise ValueError(f"memory: invalid_penalty must be >= 0, got {invalid_penalty}")
    self.invalid_penalty = float(invalid_penalty)
    self.length = length
    self.codes = symbols[:num_codes]
    self.peek_cost = float(peek_cost)
    self.distractor = distractor
    self.hint = bool(hint)
    self.style = check_style("memory", style)
    self.max_turns = length + 2

  def _cue(self, t: int) -> str:
    """What turn t (1 <= t <= length + 1) asks for."""
    if t <= self.length:
      return f"say {self.tokens[t - 1]}" if self.distractor == "echo" else "wait"
    return f"answer? {self.code}" if self.hint and self.peeked else "answer?"

  def _penalty(self, invalid: bool) -> float:
    return self.invalid_penalty if invalid else 0.0

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
      return Step(f"{reveal} {self._cue(1)}", reward - self._penalty(invalid), False, False,
                  {"invalid_action": invalid})
    if t <= self.length:
      invalid = self.distractor == "echo" and a != self.tokens[t - 1]
      return Step(self._cue(t + 1), -self._penalty(invalid), False, False, {"invalid_action": invalid})
    correct = a == self.code
    invalid = a not in self.codes
    info = {"invalid_action": invalid, "success": correct}
    return Step("right" if correct else "wrong", (1.0 if correct else 0.0) - self._penalty(invalid),
                True, False, info)

  @staticmethod
  def first_decision(action: str) -> str:
    return "peek" if action.strip() == "peek" else "skip"  # anything else reveals nothing

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    kind = "letter" if self.codes[0] in ECHO_SYMBOLS else "digit"
    return ("You are playing a memory game. First you choose: peek at a secret code (it costs "
            f"{self.peek_cost:g} points) or skip. Then you answer a few simple questions. At the end you "
            f"are asked for the code, a single {kind}: the right code earns 1 point. "
            "Always reply with a single word.")

  def _natural_cue(self, t: int) -> str:
    if t <= self.length:
      return (f"Say the letter {self.tokens[t - 1]}." if self.distractor == "echo"
              else "Wait: reply with ok.")
    if self.hint and self.peeked:
      return f"Reminder: the code was {self.code}. What is the code?"
    return "What is the code?"

  def natural_observation(self, terse: str, step) -> str:
    t = self.turn
    if step is None:
      return "Do you want to peek at the secret code, or skip? Reply with peek or skip."
    if t == 1:
      reveal = f"The code is {self.code}." if self.peeked else "You skipped: no code is shown."
      return f"{reveal} {self._natural_cue(1)}"
    if t <= self.length + 1 and not step.terminated:
      return self._natural_cue(t)
    return "Right, that is the code!" if step.info.get("success") else f"Wrong: the code was {self.code}."

  def natural_action(self, reply: str) -> str:
    t = self.turn
    options = (("peek", "skip") if t == 0 else (self.tokens[t - 1],) if t <= self.length
               and self.distractor == "echo" else ("ok",) if t <= self.length else self.codes)
    return pick_option(reply, options) or reply.strip()

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
