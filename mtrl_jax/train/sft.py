"""Warm start: behaviour cloning on recorded demonstrations.

Demo sessions (dicts from `mtrl_jax.data.demos`) are laid out exactly as
rollouts are (per turn: the prefill ids of `continuation_ids`, then the
action's ids and the id that closes a turn: a chat template's end-of-turn
token whatever the tokenizer's eos is, the byte tokenizer's eos), so the
policy learns the same format it will be sampled in (with a chat template:
the template's). Only action tokens are targets.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from absl import logging

from mtrl_jax.models.chat import HistoryTurn
from mtrl_jax.models.tokenizer import continuation_ids
from mtrl_jax.rollout.row_packing import pack_rows, plan_rows
from mtrl_jax.train.lm_step import LMBatch


def demo_tokens(session: dict, tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, loss mask) of one demo session; mask 1 on action tokens and their end-of-turn id."""
  toks: list[int] = []
  mask: list[int] = []
  history: list[HistoryTurn] = []
  for turn in session["turns"]:
    obs = continuation_ids(tokenizer, session["prompt"], history, turn["observation"])
    act = list(tokenizer.encode(turn["action"])) + [getattr(tokenizer, "end_of_turn_id", tokenizer.eos_id)]
    history.append(HistoryTurn(turn["observation"], obs, act))
    toks += obs + act
    mask += [0] * len(obs) + [1] * len(act)
  return np.asarray(toks, np.int32), np.asarray(mask, np.float32)


class DemoBatcher:
  """Deterministic minibatches of demo sessions: batch k depends only on (seed, k).

  That makes a resumed warm start see exactly the batches an uninterrupted
  one would have.
  """

  def __init__(self, sessions: Sequence[dict], tokenizer, batch_size: int, seed: int,
               only_successful: bool = False, max_len: int | None = None, pack: bool = False,
               row_multiple: int = 1, context_cap: int | None = None):
    rows = [demo_tokens(s, tokenizer) for s in sessions if s["success"] or not only_successful]
    if not rows:
      raise ValueError("no demonstrations to train on (config.sft.only_successful filtered all out?)")
    longest = max(len(t) for t, _ in rows)
    self.over_cap = int(np.sum([len(t) > context_cap for t, _ in rows])) if context_cap else 0
    if self.over_cap:
      # Rollouts end a session before it outgrows the cache: the warm start then
      # teaches turns the policy never reaches (issue 22: a 256 cap, 511-token demos).
      logging.warning("config.rollout.context_cap=%d is below %d of %d demo sessions (longest %d tokens "
                      "with this tokenizer / chat template): rollouts will end those early",
                      context_cap, self.over_cap, len(rows), longest)
    self.length = max_len or int(2 ** np.ceil(np.log2(max(longest, 16))))
    if longest > self.length:
      raise ValueError(f"a demo session has {longest} tokens, more than max_len={self.length}")
    n = len(rows)
    self.lengths = np.asarray([len(t) for t, _ in rows], np.int32)
    self.pack, self.row_multiple, self.pad_id = pack, row_multiple, tokenizer.pad_id
    self.tokens = np.full((n, self.length), tokenizer.pad_id, np.int32)
    self.mask = np.zeros((n, self.length), np.float32)
    for i, (t, m) in enumerate(rows):
      self.tokens[i, :len(t)] = t
      self.mask[i, :len(m)] = m
    self.batch_size, self.seed = batch_size, seed

  def __len__(self):
    return len(self.tokens)

  def batch(self, k: int) -> LMBatch:
    idx = self._indices(k)
    if not self.pack:
      return LMBatch(self.tokens[idx], self.mask[idx])
    # The same demos, several per row. The row count is rounded up to
    # row_multiple x a power of two so only a few shapes ever compile.
    plan = plan_rows(self.lengths[idx], self.length, row_multiple=self.row_multiple)
    rows = self.row_multiple
    while rows < plan.shape[0]:
      rows *= 2
    plan = plan_rows(self.lengths[idx], self.length, row_multiple=self.row_multiple, min_rows=rows)
    positions = np.broadcast_to(np.arange(self.length, dtype=np.int32), (len(idx), self.length))
    return LMBatch(pack_rows(self.tokens[idx], plan, self.pad_id), pack_rows(self.mask[idx], plan),
                   pack_rows(positions, plan), plan.segment_ids_rl)

  def _indices(self, k: int) -> np.ndarray:
    return np.random.default_rng([self.seed, k, 3]).integers(0, len(self.tokens), self.batch_size)

  def pad_fraction(self, k: int) -> float:
    """Share of padding tokens in batch k as trained (packed or not)."""
    return 1.0 - float(np.sum(self.lengths[self._indices(k)])) / self.batch(k).tokens_bt.size
