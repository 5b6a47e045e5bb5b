"""The synchronous rollout engine: B tasks x G sessions, played in lockstep.

Each turn, every live session is one row of the sampler's batch: the engine
appends the rows' new observations to their KV caches (ragged, one call),
decodes all live rows' actions in one `Sampler.generate` call, then steps the
environments on host threads. A session leaves the batch when its env ends the
episode, when the engine's turn limit is reached, when its next observation
plus one turn's token budget would not fit in the cache (`context_cap`), when
its env raises (`env_error`; the rest of the batch carries on), or when its
chat template renders a reply otherwise than it was sampled (`rewritten`: a
trimming template and a reply with whitespace at either end, or cut after a
newline; a reply stopped on a stop id the template does not write), since no
next context is then both the template's and the cache's (models/chat.py).
Such a session is not trained on (docs/real_model.md says why).

Determinism: given the same task seeds, keys, weights and sampling params, the
sessions are identical. Every session samples from its own key (see
rollout/ownership.py): sample g of task i uses `fold_in(group_keys[i], g)`,
folded with the turn index, so a session's tokens do not depend on the other
rows of the batch (up to floating-point summation order) nor on which actor
or host played it.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from mtrl_jax.rollout.group_prefill import append_once_per_group
from mtrl_jax.models.chat import BrokenPrefixError
from mtrl_jax.models.tokenizer import continuation_ids
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.ownership import row_keys, session_keys
from mtrl_jax.rollout.session import Session, make_turn

if TYPE_CHECKING:
  from mtrl_jax.sampling.sampler import SamplingParams


class RolloutTiming(NamedTuple):
  """Wall-clock seconds of one `run`, by phase."""
  generate_s: float   # Sampler.generate calls
  prefill_s: float    # Sampler.append calls (observations into the caches)
  env_s: float        # env reset + step, on the thread pool
  total_s: float


# Called once per session as it ends, after the run's ledger has counted it:
# `on_done(ended so far, sessions of the run, the run's ledger)`. The ledger
# already holds what a progress line shows (sessions, successes, tokens so far),
# all host-side numbers: the hook costs no device transfer.
OnDone = Callable[[int, int, TokenLedger], None]


class RolloutResult(NamedTuple):
  sessions: list[Session]   # task-major: sessions[i * G + g] is sample g of tasks[i]
  ledger: TokenLedger
  timing: RolloutTiming


def record_end(ledger: TokenLedger, s: Session, n_total: int, on_done: OnDone | None) -> None:
  """Counts the finished session `s` in `ledger`, then tells `on_done` (if any)."""
  ledger.record_session(s)
  if on_done is not None:
    on_done(ledger.sessions, n_total, ledger)


def _call(fn: Callable, *args) -> tuple[Any, BaseException | None]:
  """Runs fn in a worker thread, returning its exception instead of raising it."""
  try:
    return fn(*args), None
  except Exception as e:  # any env failure is that session's problem only
    return None, e


class RolloutEngine:
  """Plays groups of sessions against the current policy weights of `sampler`.

  Args:
    sampler: a `mtrl_jax.sampling.sampler.Sampler` (its `version` stamps the
      generated tokens; weights may change between `run` calls).
    tokenizer: turns observations into prefill ids and actions into text.
    env_factory: builds one fresh, un-reset env per session.
    group_size: G sessions per task (same seed, different samples).
    max_turns: engine-side turn limit (None: the env's own `max_turns` only).
    turn_token_budget: the most tokens one action may take.
    context_cap: KV-cache capacity per session, in tokens.
    sampling: temperature / top-k / top-p / greedy (None: the sampler's
      defaults, `SamplingParams()`).
    num_env_threads: host threads stepping environments.
    env_name: recorded on sessions (default: the env's registry name).
    group_prefill: a task's G sessions prefill their shared prompt and first
      observation once; the others copy the KV row (rollout/group_prefill.py).
  """

  def __init__(self, sampler, tokenizer, env_factory: Callable[[], Any], *, group_size: int = 1,
               max_turns: int | None = None, turn_token_budget: int = 64, context_cap: int = 2048,
               sampling: SamplingParams | None = None, num_env_threads: int = 8,
               env_name: str | None = None, group_prefill: bool = False):
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_turns is not None and max_turns < 1:
      raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
    if turn_token_budget < 1:
      raise ValueError(f"turn_token_budget must be >= 1, got {turn_token_budget}")
    if context_cap <= turn_token_budget:
      raise ValueError(f"context_cap ({context_cap}) must exceed turn_token_budget ({turn_token_budget})")
    if num_env_threads < 1:
      raise ValueError(f"num_env_threads must be >= 1, got {num_env_threads}")
    if sampling is None:
      # Imported here so the engine loads (e.g. with a test double) without the jitted sampler.
      from mtrl_jax.sampling.sampler import SamplingParams
      sampling = SamplingParams()
    self.sampler, self.tokenizer, self.env_factory = sampler, tokenizer, env_factory
    self.group_size, self.max_turns = group_size, max_turns
    self.turn_token_budget, self.context_cap = turn_token_budget, context_cap
    self.sampling, self.num_env_threads, self.env_name = sampling, num_env_threads, env_name
    self.group_prefill = bool(group_prefill)
    stop = getattr(sampler, "stop_ids", None)
    self.stop_ids = frozenset(int(i) for i in stop) if stop is not None else frozenset({tokenizer.eos_id})
    # Ids stay unique across the runs of one engine (the learner mixes batches).
    self.next_session_id = 0
    self.next_group_id = 0

  def _ids_and_keys(self, tasks: Sequence[int], rng, group_keys, group_ids) -> tuple[list, list, Any]:
    """(group ids, session ids, [n] session keys) of one run; advances the id counters.

    Without `group_ids`, groups and sessions are numbered on from the
    counters; with them, sample g of group id k is session k * G + g.
    Without `group_keys`, group i's key is `fold_in(rng, i)`.
    """
    g_size, n_tasks = self.group_size, len(tasks)
    if group_ids is None:
      gids = [self.next_group_id + i for i in range(n_tasks)]
      sids = [self.next_session_id + r for r in range(n_tasks * g_size)]
    else:
      gids = [int(k) for k in group_ids]
      if len(gids) != n_tasks or len(set(gids)) != n_tasks:
        raise ValueError(f"run: group_ids must be {n_tasks} distinct ids (one per task), got {gids}")
      sids = [k * g_size + g for k in gids for g in range(g_size)]
    if gids:
      self.next_group_id = max(self.next_group_id, max(gids) + 1)
      self.next_session_id = max(self.next_session_id, max(sids) + 1)
    if group_keys is None:
      if rng is None:
        raise ValueError("run: pass rng or group_keys")
      group_keys = [jax.random.fold_in(rng, i) for i in range(n_tasks)]
    elif len(group_keys) != n_tasks:
      raise ValueError(f"run: {len(group_keys)} group_keys for {n_tasks} tasks")
    return gids, sids, session_keys(group_keys, g_size)

  def run(self, tasks: Sequence[int], rng: jax.Array | None = None, *, group_keys: Sequence | None = None,
          group_ids: Sequence[int] | None = None, on_done: OnDone | None = None) -> RolloutResult:
    """Plays len(tasks) x group_size sessions; tasks are env seeds.

    group_keys: one key per task (default `fold_in(rng, i)`); group_ids: the
    tasks' group ids (default: numbered on from the last run's); on_done:
    called as each session ends (`OnDone`), e.g. a progress line.
    """
    t_start = time.perf_counter()
    g_size = self.group_size
    n = len(tasks) * g_size
    ledger = TokenLedger()
    timing = {"generate": 0.0, "prefill": 0.0, "env": 0.0}
    gids, sids, keys = self._ids_and_keys(tasks, rng, group_keys, group_ids)
    sessions = []
    for i, seed in enumerate(tasks):
      for g in range(g_size):
        sessions.append(Session(session_id=sids[i * g_size + g], task_id=int(seed), group_id=gids[i],
                                seed=int(seed), env_name=self.env_name or ""))
    if n == 0:
      return RolloutResult(sessions, ledger, RolloutTiming(0.0, 0.0, 0.0, time.perf_counter() - t_start))

    with concurrent.futures.ThreadPoolExecutor(self.num_env_threads) as pool:
      self._play(pool, sessions, range(n), keys, ledger, timing, on_done=on_done)
    timing_rec = RolloutTiming(timing["generate"], timing["prefill"], timing["env"],
                               time.perf_counter() - t_start)
    return RolloutResult(sessions, ledger, timing_rec)

  def _play(self, pool, sessions: list, starts: Sequence[int], keys, ledger: TokenLedger, timing: dict,
            fork: Callable | None = None, on_done: OnDone | None = None) -> None:
    """The turn loop of the lockstep engines (this one, rollout/tree.py): row r plays `sessions[r]`.

    The rows in `starts` reset their envs; then, turn after turn, every live row's new
    observation is prefilled, all live rows decode their actions in one `generate` call,
    and the envs step on the pool's threads, until no row lives. `fork(state, turn,
    sessions, envs, pending)`, called after a turn's prefill, may give rows of `sessions`
    that were None a session of their own (tree rollouts) and returns the new state.
    `on_done` hears of each session that ends, out of len(sessions).
    """
    n = len(sessions)
    envs, pending = self._start(pool, sessions, list(starts), ledger, timing, on_done)
    state = self.sampler.init_state(n, self.context_cap)
    turn = 0
    while pending:
      lengths = np.asarray(self.sampler.lengths(state))
      for r in sorted(pending):
        if lengths[r] + len(pending[r][1]) + self.turn_token_budget > self.context_cap:
          sessions[r].final_observation = pending.pop(r)[0]
          sessions[r].finish("context_cap")
          record_end(ledger, sessions[r], n, on_done)
      if not pending:
        break
      # Read (and, in the actor pool, loaded) before the prefill: the observation's last logits,
      # which the turn's first token is drawn from, come from the weights stamped on it.
      version = int(self.sampler.version)
      state = self._prefill(state, pending, n, turn, ledger, timing)
      if fork is not None:
        t0 = time.perf_counter()
        state = fork(state, turn, sessions, envs, pending)
        timing["env"] += time.perf_counter() - t0

      rows = sorted(pending)
      active = np.zeros(n, bool)
      active[rows] = True
      t0 = time.perf_counter()
      out, state = self.sampler.generate(state, row_keys(keys, turn), self.turn_token_budget, active=active,
                                         params=self.sampling)
      timing["generate"] += time.perf_counter() - t0

      actions = {}
      for r in rows:
        ids = [int(x) for x in np.asarray(out.tokens[r]).reshape(-1)]
        stopped = bool(ids) and ids[-1] in self.stop_ids
        actions[r] = (ids, self.tokenizer.decode(ids[:-1] if stopped else ids))
        ledger.record_generated(turn, len(ids))
      # Every row of the batch pays for every step the longest action took.
      ledger.record_decode(n, max(len(actions[r][0]) for r in rows))

      t0 = time.perf_counter()
      steps = dict(zip(rows, pool.map(lambda r: _call(envs[r].step, actions[r][1]), rows)))
      timing["env"] += time.perf_counter() - t0

      next_pending = {}
      for r in rows:
        nxt = self._record_turn(sessions[r], pending[r], actions[r], out.logps[r], version,
                                bool(out.hit_budget[r]), bool(out.ended_by_capacity[r]), *steps[r])
        if nxt is not None:
          next_pending[r] = nxt
        else:
          record_end(ledger, sessions[r], n, on_done)
          envs.pop(r, None)
      pending = next_pending
      turn += 1

  def _start(self, pool, sessions: list, rows: list[int], ledger: TokenLedger, timing: dict,
             on_done: OnDone | None = None) -> tuple[dict, dict]:
    """Resets the envs of `rows`: ({row: env}, {row: (first observation, its ids)}) of those that started;
    a session whose env failed is recorded as ended."""
    envs, pending = {}, {}
    for r, (env, out) in zip(rows, self._reset_all(pool, [sessions[r] for r in rows], timing)):
      s = sessions[r]
      if out is None:
        record_end(ledger, s, len(sessions), on_done)
        continue
      envs[r] = env
      s.prompt = out.prompt
      if not s.env_name:
        s.env_name = getattr(env, "name", "") or type(env).__name__
      pending[r] = (out.observation, list(self.tokenizer.observation_ids(out.observation, out.prompt)))
    return envs, pending

  def _prefill(self, state, pending: dict, n: int, turn: int, ledger: TokenLedger, timing: dict):
    """The live rows' new observations into their caches (turn 0 with group_prefill: once per group)."""
    t0 = time.perf_counter()
    if turn == 0 and self.group_prefill:
      state, prefilled, saved = append_once_per_group(self.sampler, state, pending, n,
                                                      lambda r: r // self.group_size)
      ledger.record_prefill_saved(turn, saved)
    else:
      new_tokens = [pending[r][1] if r in pending else [] for r in range(n)]
      state, prefilled = self.sampler.append(state, new_tokens), sum(len(p[1]) for p in pending.values())
    state = jax.block_until_ready(state)
    timing["prefill"] += time.perf_counter() - t0
    ledger.record_prefill(turn, prefilled)
    return state

  def _record_turn(self, s: Session, observation: tuple[str, list[int]], action: tuple[list[int], str],
                   logp, version: int, hit_budget: bool, full: bool, step, err):
    """Appends the turn to `s`; returns the next observation to prefill, or None if `s` ended."""
    (obs_text, obs_ids), (ids, text) = observation, action
    if err is not None:
      s.turns.append(make_turn(obs_text, obs_ids, text, ids, logp, version, 0.0, cut_at_budget=hit_budget,
                               env_error=True, info={"error": repr(err)}))
      s.finish("env_error", error=repr(err))
      return None
    info = dict(step.info)
    s.turns.append(make_turn(obs_text, obs_ids, text, ids, logp, version, step.reward,
                             cut_at_budget=hit_budget, invalid_action=bool(info.get("invalid_action", False)),
                             info=info))
    success = bool(info.get("success", False))
    if step.terminated or step.truncated:
      s.final_observation = step.observation
      s.finish("terminated" if step.terminated else "truncated", success=success)
    elif self.max_turns is not None and s.num_turns >= self.max_turns:
      s.final_observation = step.observation
      s.finish("truncated", success=success)
    elif full:  # unreachable while the pre-append budget check holds; kept for safety
      s.final_observation = step.observation
      s.finish("context_cap")
    else:
      # The whole history: a chat template renders the next turn after it (models/chat.py).
      try:
        return step.observation, continuation_ids(self.tokenizer, s.prompt, s.turns, step.observation)
      except BrokenPrefixError as e:
        # The template renders this reply otherwise than sampled: no next context is both the
        # template's and the cache's. This session ends, untrained (Session.trainable); the job goes on.
        s.final_observation = step.observation
        s.finish("rewritten", error=f"{e.cause}: {e}")
    return None

  def _reset_all(self, pool, sessions: list[Session], timing: dict) -> list[tuple[Any, Any]]:
    """Builds and resets one env per session; a failure ends that session as env_error."""

    def build_and_reset(s: Session):
      env = self.env_factory()
      return env, env.reset(s.seed, s.session_id)

    t0 = time.perf_counter()
    results = list(pool.map(lambda s: _call(build_and_reset, s), sessions))
    timing["env"] += time.perf_counter() - t0
    envs = []
    for s, (res, err) in zip(sessions, results):
      if err is not None:
        s.finish("env_error", error=repr(err))
        envs.append((None, None))
      else:
        envs.append(res)
    return envs
