"""Warm start: behaviour cloning on recorded demonstrations.

Demo sessions (dicts from `mtrl_jax.data.demos`) are laid out exactly as
rollouts are (`tokenizer.observation_ids` + action bytes + eos per turn), so
the policy learns the same format it will be sampled in. Only action tokens
are targets.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mtrl_jax.train.lm_step import LMBatch


def demo_tokens(session: dict, tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, loss mask) of one demo session; mask 1 on action tokens and their eos."""
  toks: list[int] = []
  mask: list[int] = []
  for t, turn in enumerate(session["turns"]):
    obs = tokenizer.observation_ids(turn["observation"], session["prompt"] if t == 0 else None)
    act = list(tokenizer.encode(turn["action"])) + [tokenizer.eos_id]
    toks += obs + act
    mask += [0] * len(obs) + [1] * len(act)
  return np.asarray(toks, np.int32), np.asarray(mask, np.float32)


class DemoBatcher:
  """Deterministic minibatches of demo sessions: batch k depends only on (seed, k).

  That makes a resumed warm start see exactly the batches an uninterrupted
  one would have.
  """

  def __init__(self, sessions: Sequence[dict], tokenizer, batch_size: int, seed: int,
               only_successful: bool = False, max_len: int | None = None):
    rows = [demo_tokens(s, tokenizer) for s in sessions if s["success"] or not only_successful]
    if not rows:
      raise ValueError("no demonstrations to train on (config.sft.only_successful filtered all out?)")
    longest = max(len(t) for t, _ in rows)
    self.length = max_len or int(2 ** np.ceil(np.log2(max(longest, 16))))
    if longest > self.length:
      raise ValueError(f"a demo session has {longest} tokens, more than max_len={self.length}")
    n = len(rows)
    self.tokens = np.full((n, self.length), tokenizer.pad_id, np.int32)
    self.mask = np.zeros((n, self.length), np.float32)
    for i, (t, m) in enumerate(rows):
      self.tokens[i, :len(t)] = t
      self.mask[i, :len(m)] = m
    self.batch_size, self.seed = batch_size, seed

  def __len__(self):
    return len(self.tokens)

  def batch(self, k: int) -> LMBatch:
    idx = np.random.default_rng([self.seed, k, 3]).integers(0, len(self.tokens), self.batch_size)
    return LMBatch(self.tokens[idx], self.mask[idx])
