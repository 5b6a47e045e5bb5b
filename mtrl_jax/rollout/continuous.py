"""Continuous batching: a scheduler that keeps the sampler's rows busy.

The lockstep engine (engine.py) decodes every live row until the longest
action of the turn is done, then steps every env and waits for the slowest;
a row whose action stopped early idles until then. Here the decode batch has
`rows` rows and each decode call runs at most `chunk` steps
(`Sampler.decode_rows`, sampling/row_steps.py), fewer when sessions wait for
rows: it then returns once a quarter of the rows (or as many as wait) ended
their actions. Between calls the scheduler

  * hands each action that ended to its env on a thread pool (env steps run
    while the rows keep decoding);
  * starts new sessions (env resets) while fewer than `in_flight` are live;
  * gives each session whose observation is back a row: a free row, or the
    row of a session that is waiting on its env, whose KV row is first
    parked in a store of `in_flight` rows (`Sampler.move_rows`) and loaded
    back into some free row when its env answers;
  * prefills the new observations of those rows in one append call;
  * with group prefill, copies a group's shared first observation from the
    session that prefilled it (rollout/group_prefill.py).

Sessions equal the lockstep engine's given the same keys: every session
draws token i of turn t with `fold_in(fold_in(session_key, t), i)` in both
engines, whatever row or call decodes it, and its KV row holds the same
tokens (moves and copies are exact), so only floating-point summation order
differs (batch shapes). Each generated token is stamped with the version of
the weights that computed the logits it was drawn from: those of the decode
call for all but a call's first token, which is drawn from the logits of the
row's last prefill or call (`Sampler.weights` hands out weights and version
together), so versions are exact across a weight switch.

Weights (partial rollouts): without `partial` a run keeps the weights it
started with until its last session ends (with the actor pool: the run is one
ticket, and the next ticket picks up the newest weights). With `partial` the
engine asks for the newest weights before every decode call
(`ActorSampler.weights(latest=True)`), so a session in flight when new
weights are published continues under them from its next chunk, mid-action;
its earlier tokens keep their versions and behaviour log-probs, and the
staleness rule (the oldest token of a group, rollout/staleness_queue.py)
reads those per-token versions. The KV rows keep what the older weights
computed (as between turns in the actor pool, rollout/actors.py).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from mtrl_jax.rollout.engine import OnDone, RolloutEngine, RolloutResult, RolloutTiming, _call, record_end
from mtrl_jax.rollout.group_prefill import leaders
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.session import Session


class DecodeCall(NamedTuple):
  """What the scheduler saw at one decode call (`ContinuousEngine.trace`)."""
  active: int  # rows decoding in this call
  rows: int  # rows of the batch
  steps: int  # steps the call ran
  tokens: int  # tokens it generated
  unplaced: int  # sessions with an observation ready that got no row
  version: int  # weights version of the call


@dataclasses.dataclass
class _Live:
  """One session in flight: where its KV row is and what it is doing."""
  idx: int
  key: Any  # the session's key
  slot: int  # its parking row in the store
  env: Any = None
  row: int = -1  # decode row holding its KV (-1: parked or not started)
  parked: bool = False  # its KV is in the store (else in `row`, or empty)
  length: int = 0  # tokens in its KV row
  phase: str = "reset"  # reset | gate | ready | decode | env
  obs: tuple | None = None  # (text, ids) of this turn's observation
  to_prefill: list = dataclasses.field(default_factory=list)
  leader: int = -1  # group prefill: copy the first observation from this session
  ids: list = dataclasses.field(default_factory=list)  # this turn's action so far
  logps: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)
  hit_budget: bool = False
  full: bool = False
  logits_version: int = -1  # version of the weights that computed the row's next-token logits
  turn_key: Any = None  # raw data of fold_in(key, turn): this turn's draws


class ContinuousEngine(RolloutEngine):
  """The rollout engine with continuous batching (see module doc).

  Takes the `RolloutEngine` arguments plus:
    rows: decode batch rows (0: one per session of the run).
    chunk: decode steps per call; a row that ends its action waits at most
      this many steps for its refill.
    in_flight: sessions live at once, i.e. parking rows (0: every session of
      the run); whole groups are started, so at least `group_size`.
    partial: in-flight sessions move to newly published weights at the next
      decode call (partial rollouts) instead of finishing on the run's.
  """

  def __init__(self, *args, rows: int = 0, chunk: int = 16, in_flight: int = 0, partial: bool = False, **kw):
    super().__init__(*args, **kw)
    if rows < 0:
      raise ValueError(f"rows must be >= 0 (0 = one per session), got {rows}")
    if chunk < 1:
      raise ValueError(f"chunk must be >= 1, got {chunk}")
    if in_flight < 0:
      raise ValueError(f"in_flight must be >= 0 (0 = every session of a run), got {in_flight}")
    self.rows, self.chunk, self.in_flight, self.partial = int(rows), int(chunk), int(in_flight), bool(partial)
    self.trace: list[DecodeCall] | None = None  # set to [] to record every decode call

  def run(self, tasks: Sequence[int], rng: jax.Array | None = None, *, group_keys: Sequence | None = None,
          group_ids: Sequence[int] | None = None, on_done: OnDone | None = None) -> RolloutResult:
    t_start = time.perf_counter()
    g_size = self.group_size
    n = len(tasks) * g_size
    gids, sids, keys = self._ids_and_keys(tasks, rng, group_keys, group_ids)
    sessions = [Session(session_id=sids[i * g_size + g], task_id=int(seed), group_id=gids[i], seed=int(seed),
                        env_name=self.env_name or "")
                for i, seed in enumerate(tasks) for g in range(g_size)]
    if n == 0:
      return RolloutResult(sessions, TokenLedger(), RolloutTiming(0.0, 0.0, 0.0, time.perf_counter() - t_start))
    play = _Play(self, sessions, keys, min(self.rows or n, n), min(max(self.in_flight or n, g_size), n), on_done)
    with concurrent.futures.ThreadPoolExecutor(self.num_env_threads) as pool:
      play.loop(pool)
    t = play.timing
    return RolloutResult(sessions, play.ledger,
                         RolloutTiming(t["generate"], t["prefill"], t["env"], time.perf_counter() - t_start))


class _Play:
  """The state of one `ContinuousEngine.run`."""

  def __init__(self, engine: ContinuousEngine, sessions: list[Session], keys, rows: int, in_flight: int,
               on_done: OnDone | None = None):
    self.e, self.sessions, self.keys, self.on_done = engine, sessions, keys, on_done
    self.key_impl = jax.random.key_impl(keys)
    self.key_shape = tuple(jax.random.key_data(keys).shape[1:])
    self.n_rows, self.n_slots = rows, in_flight
    self.ledger = TokenLedger()
    self.timing = {"generate": 0.0, "prefill": 0.0, "env": 0.0}
    self.sampler = engine.sampler
    self.act = self.sampler.init_state(rows, engine.context_cap)
    self.store = None  # parking rows, made on the first eviction
    self.weights = self.sampler.weights(latest=True)
    self.live: dict[int, _Live] = {}
    self.groups = collections.deque(range(len(sessions) // engine.group_size))
    self.free_slots = list(range(in_flight - 1, -1, -1))
    self.free_rows = list(range(rows - 1, -1, -1))
    self.owner: list[int | None] = [None] * rows
    self.waiting_rows: collections.OrderedDict[int, int] = collections.OrderedDict()  # row -> idx (on env)
    self.ready: collections.deque[int] = collections.deque()
    self.futures: dict[concurrent.futures.Future, tuple[int, str]] = {}
    self.gates: dict[int, int] = {}  # group prefill: group -> resets outstanding
    self.left = len(sessions)

  # ---------------------------------------------------------------- the loop
  def loop(self, pool) -> None:
    while self.left:
      self._admit(pool)
      idle = not self.ready and not any(lv.phase == "decode" for lv in self.live.values())
      self._harvest(block=idle)
      self._place_and_prefill()
      self._decode(pool)

  def _admit(self, pool) -> None:
    g_size = self.e.group_size
    while self.groups and len(self.free_slots) >= g_size:
      i = self.groups.popleft()
      if self.e.group_prefill:
        self.gates[i] = g_size
      for g in range(g_size):
        idx = i * g_size + g
        lv = _Live(idx, self.keys[idx], self.free_slots.pop())
        self.live[idx] = lv
        fut = pool.submit(_call, self._build_and_reset, self.sessions[idx])
        self.futures[fut] = (idx, "reset")

  def _build_and_reset(self, s: Session):
    env = self.e.env_factory()
    return env, env.reset(s.seed, s.session_id)

  def _harvest(self, block: bool) -> None:
    if not self.futures:
      if block:
        raise RuntimeError("continuous engine: sessions left but nothing running (a scheduler bug)")
      return
    if block:
      t0 = time.perf_counter()
      concurrent.futures.wait(list(self.futures), return_when=concurrent.futures.FIRST_COMPLETED)
      self.timing["env"] += time.perf_counter() - t0
    for fut in [f for f in self.futures if f.done()]:
      idx, kind = self.futures.pop(fut)
      res, err = fut.result()
      if kind == "reset":
        self._on_reset(idx, res, err)
      else:
        self._on_step(idx, res, err)

  def _on_reset(self, idx: int, res, err) -> None:
    s, lv = self.sessions[idx], self.live[idx]
    group = idx // self.e.group_size
    if err is not None:
      s.finish("env_error", error=repr(err))
      self._end(idx)
    else:
      env, out = res
      lv.env = env
      s.prompt = out.prompt
      if not s.env_name:
        s.env_name = getattr(env, "name", "") or type(env).__name__
      self._observe(idx, (out.observation, list(self.e.tokenizer.observation_ids(out.observation, out.prompt))),
                    gate=self.e.group_prefill)
    if self.e.group_prefill:
      self.gates[group] -= 1
      if self.gates[group] == 0:
        self._open_gate(group)

  def _open_gate(self, group: int) -> None:
    """All resets of a group are back: its followers copy their leader's first observation."""
    g_size = self.e.group_size
    members = [i for i in range(group * g_size, (group + 1) * g_size)
               if i in self.live and self.live[i].phase == "gate"]
    follow = leaders({i: self.live[i].obs[1] for i in members}, lambda i: 0)
    for i in members:
      lv = self.live[i]
      if i in follow:
        lv.leader = follow[i]
        lv.phase = "follow"
      else:
        lv.phase = "ready"
        self.ready.append(i)

  def _observe(self, idx: int, obs: tuple[str, list[int]], gate: bool = False) -> None:
    """A session's next observation is in: end it on the context cap or queue it for a row."""
    s, lv = self.sessions[idx], self.live[idx]
    if lv.length + len(obs[1]) + self.e.turn_token_budget > self.e.context_cap:
      s.final_observation = obs[0]
      s.finish("context_cap")
      self._end(idx)
      return
    lv.obs, lv.to_prefill = obs, list(obs[1])
    lv.ids, lv.logps, lv.versions = [], [], []
    # Turn t draws with fold_in(session key, t), as the lockstep engine's row_keys.
    lv.turn_key = np.asarray(jax.random.key_data(jax.random.fold_in(lv.key, s.num_turns)))
    if gate:
      lv.phase = "gate"
    else:
      lv.phase = "ready"
      self.ready.append(idx)

  def _on_step(self, idx: int, res, err) -> None:
    s, lv = self.sessions[idx], self.live[idx]
    ids = lv.ids
    stopped = bool(ids) and ids[-1] in self.e.stop_ids
    action = (ids, self.e.tokenizer.decode(ids[:-1] if stopped else ids))
    step = (res, err)
    nxt = self.e._record_turn(s, lv.obs, action, np.asarray(lv.logps, np.float32),
                              np.asarray(lv.versions, np.int32), lv.hit_budget, lv.full, *step)
    if nxt is None:
      self._end(idx)
    else:
      self._observe(idx, nxt)

  def _end(self, idx: int) -> None:
    lv = self.live.pop(idx)
    record_end(self.ledger, self.sessions[idx], len(self.sessions), self.on_done)
    if lv.row >= 0:
      self.owner[lv.row] = None
      self.waiting_rows.pop(lv.row, None)
      self.free_rows.append(lv.row)
    self.free_slots.append(lv.slot)
    self.left -= 1

  # -------------------------------------------------------- rows and prefill
  def _place_and_prefill(self) -> None:
    """Rows for the ready sessions, their prefill, and group followers' copies."""
    evict_rows, evict_slots, load_slots, load_rows, clear_rows = [], [], [], [], []
    unplaced = collections.deque()
    while self.ready:
      idx = self.ready.popleft()
      lv = self.live[idx]
      if lv.row >= 0:  # back from its env before anyone needed its row
        self.waiting_rows.pop(lv.row, None)
        lv.phase = "decode"
        continue
      r = self._take_row(evict_rows, evict_slots)
      if r is None:
        unplaced.append(idx)
        continue
      self.owner[r], lv.row, lv.phase = idx, r, "decode"
      if lv.parked:
        load_slots.append(lv.slot)
        load_rows.append(r)
        lv.parked = False
      else:
        clear_rows.append(r)
    self.ready = unplaced
    t0 = time.perf_counter()
    if evict_rows:
      if self.store is None:
        self.store = self.sampler.init_state(self.n_slots, self.e.context_cap)
      self.act, self.store = self.sampler.move_rows(self.act, evict_rows, self.store, evict_slots)
    if load_rows:
      self.store, self.act = self.sampler.move_rows(self.store, load_slots, self.act, load_rows)
    if clear_rows:
      self.act = self.sampler.clear_rows(self.act, clear_rows)
    prefill = {lv.row: lv for lv in self.live.values() if lv.phase == "decode" and lv.to_prefill}
    if prefill:
      self.weights = self.sampler.weights(latest=self.e.partial) if self.e.partial else self.weights
      rows = sorted(prefill)
      self.act = self.sampler.append_rows(self.act, rows, [prefill[r].to_prefill for r in rows],
                                          weights=self.weights[0])
      for lv in prefill.values():
        self.ledger.record_prefill(self.sessions[lv.idx].num_turns, len(lv.to_prefill))
        lv.length += len(lv.to_prefill)
        lv.to_prefill = []
        lv.logits_version = self.weights[1]
    self._fork_followers(set(prefill))
    self.act = jax.block_until_ready(self.act)
    self.timing["prefill"] += time.perf_counter() - t0

  def _take_row(self, evict_rows: list, evict_slots: list) -> int | None:
    if self.free_rows:
      return self.free_rows.pop()
    if self.waiting_rows:
      r, other = self.waiting_rows.popitem(last=False)  # the longest-waiting session's row
      o = self.live[other]
      evict_rows.append(r)
      evict_slots.append(o.slot)
      o.row, o.parked = -1, True
      self.owner[r] = None
      return r
    return None

  def _fork_followers(self, prefilled_rows: set) -> None:
    """Followers of leaders prefilled just now copy the leader's row: into a row
    (free, or taken from a session on its env), else into their parking row."""
    by_leader = collections.defaultdict(list)
    for lv in self.live.values():
      if lv.phase == "follow" and lv.leader in self.live and self.live[lv.leader].row in prefilled_rows:
        by_leader[lv.leader].append(lv)
    if not by_leader:
      return
    evict_rows, evict_slots, src_rows, dst_rows, park_src, park_slots = [], [], [], [], [], []
    for leader, followers in sorted(by_leader.items()):
      lead = self.live[leader]
      for lv in followers:
        self.ledger.record_prefill_saved(0, len(lv.to_prefill))
        lv.length, lv.to_prefill, lv.logits_version = lead.length, [], lead.logits_version
        r = self._take_row(evict_rows, evict_slots)
        if r is not None:
          self.owner[r], lv.row, lv.phase = lv.idx, r, "decode"
          src_rows.append(lead.row)
          dst_rows.append(r)
        else:
          lv.parked, lv.phase = True, "ready"
          park_src.append(lead.row)
          park_slots.append(lv.slot)
          self.ready.append(lv.idx)
    if evict_rows or park_slots:
      if self.store is None:
        self.store = self.sampler.init_state(self.n_slots, self.e.context_cap)
      # One move: the evicted rows still hold their owners' KV, the leaders' rows theirs.
      self.act, self.store = self.sampler.move_rows(self.act, evict_rows + park_src, self.store,
                                                    evict_slots + park_slots)
    if dst_rows:
      self.act = self.sampler.copy_rows(self.act, src_rows, dst_rows)

  # ------------------------------------------------------------------ decode
  def _decode(self, pool) -> None:
    e = self.e
    active = np.zeros(self.n_rows, bool)
    offsets = np.zeros(self.n_rows, np.int64)
    key_data = np.zeros((self.n_rows,) + self.key_shape, np.uint32)
    for r, idx in enumerate(self.owner):
      if idx is not None and self.live[idx].phase == "decode":
        lv = self.live[idx]
        active[r], offsets[r], key_data[r] = True, len(lv.ids), lv.turn_key
    if not active.any():
      return
    row_keys = jax.random.wrap_key_data(key_data, impl=self.key_impl)
    self.weights = self.sampler.weights(latest=e.partial) if e.partial else self._check_stop()
    t0 = time.perf_counter()
    # Sessions wait for rows: return once a quarter of the rows (or as many as wait) are free.
    quota = min(len(self.ready), max(1, self.n_rows // 4)) if self.ready else 0
    out, self.act = self.sampler.decode_rows(self.act, row_keys, offsets, np.full(self.n_rows, e.turn_token_budget),
                                             active, e.chunk, params=e.sampling, weights=self.weights,
                                             done_quota=quota)
    self.timing["generate"] += time.perf_counter() - t0
    self.ledger.record_decode(self.n_rows, out.steps)
    generated = 0
    for r in np.flatnonzero(active):
      lv = self.live[self.owner[r]]
      new = [int(x) for x in out.tokens[r]]
      generated += len(new)
      lv.ids += new
      lv.logps += [float(x) for x in out.logps[r]]
      if new:
        # A token is drawn from the logits the previous step computed: the first of
        # this call from those of the last prefill or call, the others from this call's.
        lv.versions += [lv.logits_version] + [out.version] * (len(new) - 1)
        lv.logits_version = out.version
      lv.length += len(new)
      if out.done[r]:
        lv.hit_budget, lv.full = bool(out.hit_budget[r]), bool(out.full[r])
        self.ledger.record_generated(self.sessions[lv.idx].num_turns, len(lv.ids))
        lv.phase = "env"
        self.waiting_rows[r] = lv.idx
        stopped = bool(lv.ids) and lv.ids[-1] in e.stop_ids
        text = e.tokenizer.decode(lv.ids[:-1] if stopped else lv.ids)
        fut = pool.submit(_call, lv.env.step, text)
        self.futures[fut] = (lv.idx, "step")
    if e.trace is not None:
      e.trace.append(DecodeCall(int(active.sum()), self.n_rows, out.steps, generated, len(self.ready),
                                out.version))

  def _check_stop(self):
    """The run's own weights; still asks the sampler, so a stopping actor pool stops this run."""
    self.sampler.weights(latest=False)
    return self.weights
