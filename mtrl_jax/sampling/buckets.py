"""Shape buckets: every jitted sampler call sees one of a few shapes (chunk
length, decode buffer, allocated cache slots), so a long run compiles a
bounded number of programs whatever lengths its turns have."""
from __future__ import annotations

from typing import Sequence

# Steps of ~1.5x: a chunk is padded by at most half its length (observations
# of a multi-turn session are short; padding them to a power of two wastes
# up to half of every prefill).
DEFAULT_LENGTH_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
MIN_STEPS = 8
MIN_SLOTS = 64


def chunk_bucket(n: int, length_buckets: Sequence[int]) -> int:
  """Padded length of an appended chunk of n <= max(length_buckets) tokens."""
  for b in length_buckets:
    if b >= n:
      return b
  raise ValueError(f"a chunk of {n} tokens exceeds the largest of length_buckets={list(length_buckets)}")


def steps_bucket(n: int) -> int:
  """Size of the token buffer of a generate call: a power of two >= n.

  The loop itself stops at the exact budget; only the buffer is rounded.
  """
  b = MIN_STEPS
  while b < n:
    b *= 2
  return b


def slots_bucket(need: int, capacity: int) -> int:
  """How many cache slots per row to allocate for `need` (>= need, <= capacity).

  Attention reads every allocated slot at every step, so early turns of a
  long session should not pay for the whole capacity. The ladder 64, 96, 128,
  192, 256, ... wastes at most a third of the slots with ~2 sizes per octave.
  """
  w = MIN_SLOTS
  while True:
    for candidate in (w, w + w // 2):
      if candidate >= need:
        return min(candidate, capacity)
    if w >= capacity:
      return capacity
    w *= 2
