"""One prefill per group: the G sessions of a task start from the same prompt
and first observation, so only one of them prefills it and the others get a
copy of its KV row (`Sampler.copy_rows`, `Sampler.move_rows`).

Who shares: within one group, a session whose first-turn ids equal an earlier
session's ids copies that session's row (its "leader"). Ids are compared, not
assumed: an env whose reset depends on more than the seed simply shares less.
The copy is exact (same cached keys and values, same length, same next-token
logits), so every session then samples from its own key exactly as if it had
prefilled the prompt itself. The ledger counts the copied tokens as
`prefill_saved` (rollout/ledger.py).
"""
from __future__ import annotations

from typing import Callable, Hashable, Mapping, Sequence


def leaders(first_ids: Mapping[int, Sequence[int]], group_of: Callable[[int], Hashable]) -> dict[int, int]:
  """{follower: leader} over the keys of `first_ids` (rows or sessions).

  The leader of a follower is the smallest key of the same group with the
  same ids; a key with no earlier equal is its own leader and is left out.
  """
  first: dict[tuple, int] = {}
  out = {}
  for k in sorted(first_ids):
    sig = (group_of(k), tuple(int(i) for i in first_ids[k]))
    if sig in first:
      out[k] = first[sig]
    else:
      first[sig] = k
  return out


def append_once_per_group(sampler, state, pending: Mapping[int, tuple[str, Sequence[int]]], batch: int,
                          group_of: Callable[[int], Hashable]):
  """The lockstep engine's first-turn append with group sharing.

  pending: {row: (observation text, ids)}. Prefills only the leader rows,
  then copies each leader's row into its followers. Returns (state, tokens
  prefilled, tokens saved). The passed state is donated.
  """
  follow = leaders({r: ids for r, (_, ids) in pending.items()}, group_of)
  new_tokens = [list(pending[r][1]) if r in pending and r not in follow else [] for r in range(batch)]
  state = sampler.append(state, new_tokens)
  if follow:
    dst = sorted(follow)
    state = sampler.copy_rows(state, [follow[r] for r in dst], dst)
  prefilled = sum(len(t) for t in new_tokens)
  saved = sum(len(pending[r][1]) for r in follow)
  return state, prefilled, saved
