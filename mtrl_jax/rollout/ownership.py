"""Who plays what: each host's share of an update's tasks, and per-session keys.

On a pod every process (host) plays only its share of each update's groups:
a contiguous block of the T group indices, so that a group (all G samples
of one task) stays whole on one host and group-relative baselines never
need another host's sessions. What a group plays does not depend on the
number of hosts:

* its task seed is `task_seeds(seed, update, T)[j]` for its index j in the
  update (train/source.py), computed the same way on every host;
* its id is the global group number `update * T + j`, and sample g of it is
  session `id * G + g`;
* sample g draws its tokens from `session_key(group_key(base, update, j), g)`
  folded with the turn index: one key per session (the sampler takes one
  key per batch row), never a key split over the rows of a batch. Which host
  or which row of whose batch plays a session therefore changes nothing but
  floating-point summation order.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp


class HostShare(NamedTuple):
  """Process `index` of `count` plays groups [start, stop) of every update's `tasks`."""
  index: int
  count: int
  tasks: int
  start: int
  stop: int

  @property
  def size(self) -> int:
    return self.stop - self.start

  @property
  def indices(self) -> range:
    return range(self.start, self.stop)

  def global_index(self, local: int) -> int:
    """The update-level group index of this host's `local`-th group."""
    return self.start + local


def host_share(tasks: int, index: int | None = None, count: int | None = None, *,
               field: str = "rl.tasks_per_update", allow_empty: bool = False) -> HostShare:
  """The contiguous block of `tasks` groups that process `index` of `count` plays.

  Blocks differ in size by at most one. For training every process must get
  at least one group (a host with no work per update is almost certainly a
  misconfiguration); `allow_empty` lifts that (evaluation on few tasks).
  """
  index = jax.process_index() if index is None else int(index)
  count = jax.process_count() if count is None else int(count)
  if not 0 <= index < count:
    raise ValueError(f"host_share: process index {index} outside [0, {count})")
  if tasks < count and not allow_empty:
    raise ValueError(f"{field}={tasks} is smaller than the {count} processes: every host must play at "
                     f"least one group per update; use a multiple of {count}")
  base, extra = divmod(tasks, count)
  start = index * base + min(index, extra)
  return HostShare(index, count, tasks, start, start + base + (index < extra))


def group_number(update: int, index: int, tasks: int) -> int:
  """The global number (and id) of group `index` of update `update`."""
  return int(update) * int(tasks) + int(index)


def group_key(base: jax.Array, update: int, index: int, round_: int = 0) -> jax.Array:
  """The key of group `index` of update `update` (`round_` > 0: a dynamic-sampling redraw)."""
  key = jax.random.fold_in(jax.random.fold_in(base, int(update)), int(index))
  return jax.random.fold_in(key, int(round_)) if round_ else key


def session_key(group: jax.Array, sample: int) -> jax.Array:
  """The key of sample `sample` of a group; turn t samples with `fold_in(session_key, t)`."""
  return jax.random.fold_in(group, int(sample))


def session_keys(group_keys: Sequence[jax.Array], group_size: int) -> jax.Array:
  """[len(group_keys) * group_size] keys, task-major: entry i * G + g is `session_key(group_keys[i], g)`."""
  if not len(group_keys):
    return jax.random.split(jax.random.key(0), 0)
  samples = jnp.arange(group_size, dtype=jnp.uint32)
  stacked = jnp.stack([jnp.asarray(k) for k in group_keys])
  return jax.vmap(lambda k: jax.vmap(lambda g: jax.random.fold_in(k, g))(samples))(stacked).reshape(-1)


def row_keys(keys: jax.Array, turn: int) -> jax.Array:
  """[B] keys of one turn: row b samples with `fold_in(keys[b], turn)`."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, int(turn))
