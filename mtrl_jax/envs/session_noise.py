"""Per-session randomness for the probes whose horizon must matter (`delayed`, `revisit`).

A task seed fixes what the agent is shown (the strings to copy, the corridor);
the randomness it is never shown (reward noise, payoff draws, slips) comes from
a second stream. By default that stream is the session's own: seeded from
(task seed, session id), so the sessions of one group, which share the task
seed, see independent noise and a group baseline cannot cancel it. With
`crn=True` (common random numbers, for the lab) it is seeded from the task seed
alone: every session of the task draws the same numbers, as `bifurcation` does.

A session without an id (a demo, a hand-made reset) and without `crn` draws
from the operating system: independent, not reproducible.
"""
from __future__ import annotations

import random

from mtrl_jax.envs.base import derive_seed


def noise_rng(name: str, seed: int, session: int | None, crn: bool, salt: int = 0) -> random.Random:
  """The hidden-randomness stream of one session of task `seed` (see the module doc).

  `salt` != 0 gives another reproducible stream for the same (task, session): a run that salts
  with its own seed sees eval draws of its own on the eval tasks every run shares. 0 keeps the
  streams every record so far was played with.
  """
  extra = (salt,) if salt else ()
  if crn:
    return random.Random(derive_seed(name, "crn", seed, *extra))
  if session is None:
    return random.Random(random.SystemRandom().getrandbits(63))
  return random.Random(derive_seed(name, "session", seed, session, *extra))
