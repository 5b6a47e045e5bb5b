"""The typed records of the sampler: how to sample, the device state of a
batch of sessions, and what one `generate` call hands back to the host."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from mtrl_jax.models.transformer import KVCache


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Temperature, then top-k, then top-p (nucleus); or plain argmax.

  top_k=0 and top_p=1.0 switch those filters off. Greedy ignores the other
  three fields.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False

  def __post_init__(self):
    if not self.greedy and not self.temperature > 0:
      raise ValueError(f"SamplingParams.temperature must be > 0 (or set greedy=True), got {self.temperature}")
    if int(self.top_k) != self.top_k or self.top_k < 0:
      raise ValueError(f"SamplingParams.top_k must be an integer >= 0 (0 = off), got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 = off), got {self.top_p}")


class DecodeState(NamedTuple):
  """Per-row KV caches of a batch of sessions plus the fp32 next-token logits
  after each row's last cached token (what the next sampled token comes from).

  The cache arrays start small and grow (by the sampler, along a short ladder
  of sizes) up to `capacity`, the most tokens a row may hold: attention reads
  every allocated slot at every step, so early turns of a long session should
  not pay for slots nobody has reached. A pytree that lives on the device.
  `Sampler.append` / `generate` donate it: after a call only the returned
  state is valid.
  """
  cache: KVCache
  last_logits_bv: jax.Array
  capacity: jax.Array  # int32 []: the per-row token limit (>= cache.capacity)


class GenerateOut(NamedTuple):
  """Host-side result of one `Sampler.generate` call (numpy)."""
  tokens: list  # per row: int32 ids incl. a final stop id if one was hit ([] when inactive)
  logps: list  # per row: fp32 behaviour log-prob of each generated id
  hit_budget: np.ndarray  # bool [B]: generated max_new_tokens, no stop id
  ended_by_capacity: np.ndarray  # bool [B]: stopped because the row's cache is full
