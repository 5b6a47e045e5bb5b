"""The token ledger: where the tokens of a rollout batch went.

Generation cost and prefill cost scale differently with the horizon (each turn
prefills its observation once, then decodes its action token by token), so the
ledger keeps both, by turn index, plus how many sessions ended each way and how
many tokens were spent on sessions that can never be trained on (env errors).

The engine records tokens as it feeds the sampler (`record_prefill`,
`record_generated`) and sessions as they end (`record_session`); totals are
kept as separate counters so `check()` can verify that the per-turn arrays,
the totals and the session records all agree. Tree rollouts share prefixes:
each token is counted once, by the session that paid for it (`own_tokens`).

One prefill per group (`rollout.group_prefill`): the G sessions of a task
share their prompt and first observation; it is prefilled once and the KV row
copied, so the copies are counted as `prefill_saved` instead of prefilled
(prefilled + saved is what the session records hold). `decode_row_steps`
counts batch rows x decode steps the sampler ran: generated tokens over it is
the decode slot utilisation (1.0: no row ever idled during a decode step).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from mtrl_jax.rollout.session import END_REASONS, Session


def own_tokens(s: Session) -> list[tuple[int, int, int]]:
  """(turn, prefilled, generated) tokens this session paid for itself.

  A tree child (`branch_of = (parent, t)`) shares turns before t and turn t's
  observation with its parent, which already paid for them: a shared prefix
  counts once across a tree.
  """
  fork = -1 if s.branch_of is None else int(s.branch_of[1])
  return [(k, len(t.obs_ids) if k > fork else 0, len(t.action_ids) if k >= fork else 0)
          for k, t in enumerate(s.turns)]


def _grow(a: np.ndarray, n: int) -> np.ndarray:
  return a if len(a) >= n else np.concatenate([a, np.zeros(n - len(a), a.dtype)])


def _sum_grown(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  n = max(len(a), len(b))
  return _grow(a, n) + _grow(b, n)


@dataclasses.dataclass
class TokenLedger:
  """Token and session counts of one or more rollout batches."""
  generated_by_turn: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  prefilled_by_turn: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  generated_total: int = 0
  prefilled_total: int = 0
  sessions: int = 0
  turns: int = 0
  end_reasons: dict = dataclasses.field(default_factory=lambda: {r: 0 for r in END_REASONS})
  cut_at_budget: int = 0
  invalid_actions: int = 0
  successes: int = 0
  untrainable_tokens: int = 0  # prefilled + generated tokens of untrainable sessions
  prefill_saved_by_turn: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  prefill_saved_total: int = 0  # observation tokens copied from a group sibling instead of prefilled
  decode_row_steps: int = 0  # sum over decode calls of batch rows x steps run

  # -- recording -------------------------------------------------------------

  def record_prefill(self, turn: int, n: int) -> None:
    self.prefilled_by_turn = _grow(self.prefilled_by_turn, turn + 1)
    self.prefilled_by_turn[turn] += n
    self.prefilled_total += int(n)

  def record_prefill_saved(self, turn: int, n: int) -> None:
    """n observation tokens of `turn` were copied from a sibling's KV row, not prefilled."""
    self.prefill_saved_by_turn = _grow(self.prefill_saved_by_turn, turn + 1)
    self.prefill_saved_by_turn[turn] += n
    self.prefill_saved_total += int(n)

  def record_decode(self, rows: int, steps: int) -> None:
    """One decode call over `rows` batch rows ran `steps` steps."""
    self.decode_row_steps += int(rows) * int(steps)

  @property
  def slot_utilisation(self) -> float:
    """Generated tokens / (rows x decode steps); 0 when nothing was decoded."""
    return self.generated_total / self.decode_row_steps if self.decode_row_steps else 0.0

  def record_generated(self, turn: int, n: int) -> None:
    self.generated_by_turn = _grow(self.generated_by_turn, turn + 1)
    self.generated_by_turn[turn] += n
    self.generated_total += int(n)

  def record_session(self, s: Session) -> None:
    """Counts a finished session (its tokens are recorded separately)."""
    if s.end_reason is None:
      raise ValueError(f"session {s.session_id} has no end_reason yet; record it once finished")
    self.sessions += 1
    self.turns += s.num_turns
    self.end_reasons[s.end_reason] = self.end_reasons.get(s.end_reason, 0) + 1
    self.cut_at_budget += sum(t.cut_at_budget for t in s.turns)
    self.invalid_actions += sum(t.invalid_action for t in s.turns)
    self.successes += int(s.success)
    if not s.trainable:
      self.untrainable_tokens += sum(p + g for _, p, g in own_tokens(s))

  @classmethod
  def from_sessions(cls, sessions: Iterable[Session], *, prefill_saved: int = 0,
                    decode_row_steps: int = 0) -> "TokenLedger":
    """The ledger a set of finished sessions implies (tokens counted from the records).

    The records cannot tell which first-turn tokens were copied from a group
    sibling: pass their count as `prefill_saved` (moved from prefilled to
    saved, turn 0), and the decode row steps the engines reported.
    """
    ledger = cls()
    for s in sessions:
      for k, prefilled, generated in own_tokens(s):
        ledger.record_prefill(k, prefilled)
        ledger.record_generated(k, generated)
      ledger.record_session(s)
    if prefill_saved:
      ledger.record_prefill(0, -int(prefill_saved))
      ledger.record_prefill_saved(0, int(prefill_saved))
    ledger.record_decode(1, decode_row_steps)
    return ledger

  def merge(self, other: "TokenLedger") -> "TokenLedger":
    """The sum of two ledgers (e.g. of several batches or actors)."""
    n = max(len(self.generated_by_turn), len(other.generated_by_turn),
            len(self.prefilled_by_turn), len(other.prefilled_by_turn),
            len(self.prefill_saved_by_turn), len(other.prefill_saved_by_turn))
    reasons = {r: self.end_reasons.get(r, 0) + other.end_reasons.get(r, 0)
               for r in set(self.end_reasons) | set(other.end_reasons)}
    return TokenLedger(
        generated_by_turn=_grow(self.generated_by_turn, n) + _grow(other.generated_by_turn, n),
        prefilled_by_turn=_grow(self.prefilled_by_turn, n) + _grow(other.prefilled_by_turn, n),
        generated_total=self.generated_total + other.generated_total,
        prefilled_total=self.prefilled_total + other.prefilled_total,
        sessions=self.sessions + other.sessions, turns=self.turns + other.turns,
        end_reasons=reasons, cut_at_budget=self.cut_at_budget + other.cut_at_budget,
        invalid_actions=self.invalid_actions + other.invalid_actions,
        successes=self.successes + other.successes,
        untrainable_tokens=self.untrainable_tokens + other.untrainable_tokens,
        prefill_saved_by_turn=_grow(self.prefill_saved_by_turn, n) + _grow(other.prefill_saved_by_turn, n),
        prefill_saved_total=self.prefill_saved_total + other.prefill_saved_total,
        decode_row_steps=self.decode_row_steps + other.decode_row_steps)

  # -- reading -----------------------------------------------------------------

  def check(self, sessions: Iterable[Session] | None = None) -> None:
    """Raises ValueError if the counters disagree (with each other or with `sessions`)."""
    if int(self.generated_by_turn.sum()) != self.generated_total:
      raise ValueError(f"generated_by_turn sums to {int(self.generated_by_turn.sum())}, "
                       f"generated_total is {self.generated_total}")
    if int(self.prefilled_by_turn.sum()) != self.prefilled_total:
      raise ValueError(f"prefilled_by_turn sums to {int(self.prefilled_by_turn.sum())}, "
                       f"prefilled_total is {self.prefilled_total}")
    if int(self.prefill_saved_by_turn.sum()) != self.prefill_saved_total:
      raise ValueError(f"prefill_saved_by_turn sums to {int(self.prefill_saved_by_turn.sum())}, "
                       f"prefill_saved_total is {self.prefill_saved_total}")
    if sum(self.end_reasons.values()) != self.sessions:
      raise ValueError(f"end_reasons count {sum(self.end_reasons.values())} sessions, sessions is {self.sessions}")
    if sessions is None:
      return
    ref = TokenLedger.from_sessions(sessions)
    # What the records hold was either prefilled or copied from a group sibling.
    mine = dataclasses.replace(self, prefilled_total=self.prefilled_total + self.prefill_saved_total,
                               prefilled_by_turn=_sum_grown(self.prefilled_by_turn, self.prefill_saved_by_turn))
    for name in ("generated_total", "prefilled_total", "sessions", "turns", "untrainable_tokens"):
      if getattr(ref, name) != getattr(mine, name):
        raise ValueError(f"ledger {name}={getattr(mine, name)} (prefill saved counted in) but the sessions "
                         f"hold {getattr(ref, name)}")
    for name in ("generated_by_turn", "prefilled_by_turn"):
      a, b = getattr(mine, name), getattr(ref, name)
      n = max(len(a), len(b))
      if not np.array_equal(_grow(a, n), _grow(b, n)):
        raise ValueError(f"ledger {name}={a.tolist()} but the sessions hold {b.tolist()}")

  def to_metrics(self, prefix: str = "ledger/") -> dict[str, float]:
    """A flat {name: number} dict for the metric writers."""
    m = {
        "tokens_generated": self.generated_total,
        "tokens_prefilled": self.prefilled_total,
        "tokens_total": self.generated_total + self.prefilled_total,
        "tokens_untrainable": self.untrainable_tokens,
        "sessions": self.sessions,
        "turns": self.turns,
        "turns_per_session": self.turns / max(self.sessions, 1),
        "generated_per_turn": self.generated_total / max(self.turns, 1),
        "cut_at_budget": self.cut_at_budget,
        "invalid_actions": self.invalid_actions,
        "success_rate": self.successes / max(self.sessions, 1),
    }
    if self.prefill_saved_total:
      m["tokens_prefill_saved"] = self.prefill_saved_total
    if self.decode_row_steps:
      m["decode_row_steps"] = self.decode_row_steps
      m["slot_utilisation"] = self.slot_utilisation
    m.update({f"end_{r}": c for r, c in sorted(self.end_reasons.items())})
    m.update({f"generated_turn_{k}": int(v) for k, v in enumerate(self.generated_by_turn)})
    m.update({f"prefilled_turn_{k}": int(v) for k, v in enumerate(self.prefilled_by_turn)})
    return {prefix + k: float(v) for k, v in m.items()}
