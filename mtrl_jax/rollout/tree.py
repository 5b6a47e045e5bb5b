"""Tree rollouts (Tree-GRPO, arXiv 2509.21240): sessions that branch at chosen turns.

Every task gets `roots` trees. At each turn in `branch_turns`, every live
session forks into `width` siblings: the environment is cloned and the
session's KV-cache row is copied (`Sampler.copy_rows`), after the turn's
observation was prefilled and before its action is sampled. The siblings
then sample different actions from the same state. The prefix they share is
generated and prefilled once, and the ledger counts it once; each leaf is a
complete session record (shared turns included) that trains like a chain.

Layout: one engine batch row per leaf, fixed for the whole run (so forking
compiles no new append/generate programs). Tree k of task i owns the rows
`i * G + k * L ... + L - 1` (L = width ** len(branch_turns) leaves per tree,
G = roots * L = `group_size`). The root plays in the first row of its
block; at branch depth d a live row r forks into r + j * L / width**(d+1),
j = 1 .. width - 1, and keeps playing as sibling 0. Sessions therefore come
out task-major, `sessions[i * G + g]`, like the chain engine's, except that
a session which ends before a branch turn has no siblings there: its unborn
rows are left out (fewer than G sessions for that task).

Randomness after a fork: a deep copy of the env would hand every sibling the parent's random
stream, so siblings of a stochastic env (noise, slips, a payoff drawn as it goes) would all see the
same future and their comparison would lose the env's spread. Each child therefore redraws what the
policy has not seen yet (`Env.redraw`) from a seed of (task seed, its session id): reproducible, and
independent of the parent's. `TreeSpec(shared_draws=True)` keeps the parent's stream instead (common
random numbers across siblings); an env built with `crn=True` keeps it too, since there every
session of a task already draws the same numbers.

Session records: `tree_id` is the root's session id, `node_id` the leaf's
index inside its tree (0 = the root's own line), and `branch_of =
(parent session id, turn)`: the child shares turns [0, turn) and turn
`turn`'s observation with the parent and acts on its own from that turn on.
"""
from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import time
from typing import Sequence

import jax

from mtrl_jax.envs.base import derive_seed
from mtrl_jax.rollout.engine import RolloutEngine, RolloutResult, RolloutTiming
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.session import Session


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """Where and how wide sessions branch.

  branch_turns: turn indices (0-based) at which every live session forks;
    turn 0 shares only the prompt and first observation.
  width: siblings per fork (the parent continues as one of them).
  shared_draws: children keep the parent's random stream (common random numbers across siblings)
    instead of redrawing their future (module doc).
  """
  branch_turns: tuple = ()
  width: int = 2
  shared_draws: bool = False

  def __post_init__(self):
    turns = tuple(int(t) for t in self.branch_turns)
    if any(t < 0 for t in turns) or len(set(turns)) != len(turns):
      raise ValueError(f"TreeSpec.branch_turns must be distinct turns >= 0, got {list(self.branch_turns)}")
    if int(self.width) < 1:
      raise ValueError(f"TreeSpec.width must be >= 1, got {self.width}")
    object.__setattr__(self, "branch_turns", tuple(sorted(turns)))
    object.__setattr__(self, "width", int(self.width))

  @property
  def leaves(self) -> int:
    """Leaves (complete sessions) per tree when no session ends early."""
    return self.width ** len(self.branch_turns)

  def roots(self, group_size: int) -> int:
    if group_size % self.leaves:
      raise ValueError(f"group_size {group_size} is not a multiple of the {self.leaves} leaves per tree "
                       f"(width {self.width} ** {len(self.branch_turns)} branch turns)")
    return group_size // self.leaves


def clone_env(env):
  """An independent copy of a live env (deep copy: wrappers included)."""
  return copy.deepcopy(env)


def _common_draws(env) -> bool:
  """Whether the env (under any wrappers) draws common random numbers across a task's sessions."""
  while env is not None:
    if getattr(env, "crn", False):
      return True
    env = getattr(env, "env", None)
  return False


class TreeRolloutEngine(RolloutEngine):
  """The synchronous engine, playing trees of sessions (see module doc).

  Takes the `RolloutEngine` arguments plus `tree: TreeSpec`; `group_size`
  is the number of leaves per task (a multiple of `tree.leaves`).
  """

  def __init__(self, *args, tree: TreeSpec, **kw):
    super().__init__(*args, **kw)
    self.tree = tree
    self.roots = tree.roots(self.group_size)

  def run(self, tasks: Sequence[int], rng: jax.Array | None = None, *, group_keys: Sequence | None = None,
          group_ids: Sequence[int] | None = None) -> RolloutResult:
    t_start = time.perf_counter()
    g_size, leaves = self.group_size, self.tree.leaves
    n = len(tasks) * g_size
    ledger = TokenLedger()
    timing = {"generate": 0.0, "prefill": 0.0, "env": 0.0}
    # Row r of task i plays leaf r - i * G: its session id and key are the
    # ones a chain engine gives sample r - i * G (a forked child has its own).
    gids, sids, keys = self._ids_and_keys(tasks, rng, group_keys, group_ids)
    slots: list[Session | None] = [None] * n  # row r plays session id sids[r] once born
    for i, seed in enumerate(tasks):
      for k in range(self.roots):
        r = i * g_size + k * leaves
        slots[r] = Session(session_id=sids[r], task_id=int(seed), group_id=gids[i],
                           seed=int(seed), env_name=self.env_name or "")
    roots = [r for r in range(n) if slots[r] is not None]
    if n == 0:
      return RolloutResult([], ledger, RolloutTiming(0.0, 0.0, 0.0, time.perf_counter() - t_start))
    with concurrent.futures.ThreadPoolExecutor(self.num_env_threads) as pool:
      self._play(pool, slots, roots, keys, ledger, timing, fork=self._branch)
    sessions = [s for s in slots if s is not None]
    timing_rec = RolloutTiming(timing["generate"], timing["prefill"], timing["env"],
                               time.perf_counter() - t_start)
    return RolloutResult(sessions, ledger, timing_rec)

  def _branch(self, state, turn: int, slots: list, envs: dict, pending: dict):
    """At a branch turn, forks every live row into `width` siblings (env clone + cache row copy)."""
    if turn not in self.tree.branch_turns:
      return state
    depth = self.tree.branch_turns.index(turn)
    stride = self.tree.leaves // self.tree.width ** (depth + 1)
    src, dst = [], []
    for r in sorted(pending):
      parent = slots[r]
      for j in range(1, self.tree.width):
        c = r + j * stride
        if slots[c] is not None:
          raise RuntimeError(f"tree layout: row {c} is already taken (forking row {r} at turn {turn})")
        # The child's id is the one its row would have had (sids[c]).
        slots[c] = Session(session_id=parent.session_id + j * stride, task_id=parent.task_id,
                           group_id=parent.group_id, seed=parent.seed, env_name=parent.env_name,
                           tree_id=parent.tree_id, node_id=parent.node_id + j * stride,
                           branch_of=(parent.session_id, turn), prompt=parent.prompt,
                           turns=list(parent.turns))
        envs[c] = clone_env(envs[r])
        if not (self.tree.shared_draws or _common_draws(envs[c])):
          envs[c].redraw(derive_seed("tree-fork", parent.seed, slots[c].session_id))
        pending[c] = pending[r]
        src.append(r)
        dst.append(c)
    return self.sampler.copy_rows(state, src, dst)
