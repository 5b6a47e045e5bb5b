"""Shared helpers of the rollout tests (imported by name; tests/rollout is on
sys.path under pytest's default import mode): hypothesis strategies for sessions built
with the byte tokenizer, and a tiny deterministic env."""
import random
from types import SimpleNamespace

import numpy as np
from hypothesis import strategies as st

from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.envs.delayed import Delayed
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.rollout.session import Session, make_turn

TOK = ByteTokenizer()
# Observations use lowercase letters, actions uppercase letters and digits, so
# a token id alone tells which side of the exchange it came from.
OBS_CHARS = "abcdefghijklmnopqrstuvwxyz "
ACT_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ACTION_IDS = frozenset(TOK.encode(ACT_CHARS)) | {TOK.eos_id}


@st.composite
def sessions_st(draw, session_id=0, group_id=0):
  prompt = draw(st.text(OBS_CHARS, min_size=0, max_size=6))
  n_turns = draw(st.integers(1, 4))
  s = Session(session_id=session_id, task_id=group_id, group_id=group_id, seed=group_id,
              env_name="fake", prompt=prompt)
  for k in range(n_turns):
    obs = draw(st.text(OBS_CHARS, min_size=0, max_size=8))
    act = draw(st.text(ACT_CHARS, min_size=0, max_size=6))
    cut = draw(st.booleans()) and len(act) > 0
    ids = TOK.encode(act) + ([] if cut else [TOK.eos_id])
    logp = draw(st.lists(st.floats(-9.0, -0.125, width=32), min_size=len(ids), max_size=len(ids)))
    version = draw(st.integers(0, 5))
    reward = draw(st.floats(-1.0, 1.0, width=32, allow_subnormal=False))
    s.turns.append(make_turn(obs, TOK.observation_ids(obs, prompt if k == 0 else None), act, ids,
                             logp, version, reward, cut_at_budget=cut))
  s.finish(draw(st.sampled_from(["terminated", "truncated", "context_cap"])),
           success=draw(st.booleans()))
  return s


@st.composite
def session_lists_st(draw, max_sessions=5):
  n = draw(st.integers(1, max_sessions))
  group_size = draw(st.integers(1, 3))
  return [draw(sessions_st(session_id=100 + 7 * i, group_id=50 + 3 * (i // group_size)))
          for i in range(n)]


class CountEnv(Env):
  """Say the shown number plus one; `horizon` turns; +1 per right answer.

  Optionally raises on some (seed, turn) pairs to play a broken env.
  """

  def __init__(self, horizon: int = 3, fail_turns: tuple = (), fail_reset: bool = False):
    self.max_turns = horizon
    self.fail_turns, self.fail_reset = fail_turns, fail_reset

  def _reset(self, seed):
    if self.fail_reset:
      raise RuntimeError("reset failed")
    self.value = self.rng.randrange(10)
    return Reset("count up", f"n {self.value}")

  def _step(self, action):
    if self.turn in self.fail_turns:
      raise RuntimeError(f"step failed at turn {self.turn}")
    right = action.strip() == str(self.value + 1)
    self.value = self.rng.randrange(10)
    return Step(f"n {self.value}", float(right), False, False,
                {"invalid_action": not action.strip().isdigit()})

  def expert_action(self):
    return str(self.value + 1)

  def random_action(self, rng: random.Random):
    return str(rng.randrange(11))



class ParityEnv(Env):
  """Sessions that end at different times, some won: task `seed` lasts 1 + seed % 3 turns and is
  won when its last action has an even length. Seed 98 shows a 300-character observation (the
  session ends on the context cap before its first turn), seed 99 fails its reset (env_error):
  every way a session can end before its first action."""

  def __init__(self):
    self.max_turns = 3

  def _reset(self, seed):
    if seed == 99:
      raise RuntimeError("reset failed")
    self.length = 1 + seed % 3
    return Reset("say anything", "x" * 300 if seed == 98 else f"go {seed}")

  def _step(self, action):
    last = self.turn + 1 == self.length
    return Step("go on", 0.0, last, False, {"success": last and len(action) % 2 == 0} if last else {})

  def expert_action(self):
    return "ab"

  def random_action(self, rng: random.Random):
    return "a" * rng.randrange(3)


class ResetLog:
  """What every env reset of a run received: (seed, session) pairs, appended from the env threads."""

  def __init__(self):
    self.calls: list[tuple[int, int | None]] = []

  def __call__(self, seed, session):
    self.calls.append((int(seed), None if session is None else int(session)))  # list.append is atomic


class LoggedDelayed(Delayed):
  """The `delayed` probe (per-session noise and payoff, envs/session_noise.py) that logs each reset.

  Noise 0.5 and horizon 4 by default: a session draws 3 noise signs and a payoff from its own
  stream, so two runs of a batch whose streams come from the operating system record the same
  rewards with odds of about 0.07 per session (about 1e-9 for 8 sessions).
  """

  def __init__(self, log: ResetLog, horizon: int = 4, noise: float = 0.5):
    super().__init__(horizon=horizon, noise=noise)
    self.log = log

  def reset(self, seed, session=None):
    self.log(seed, session)
    return super().reset(seed, session)


def assert_reset_with_session_ids(log: ResetLog, sessions) -> None:
  """Each session that an env reset started (a tree's forks are clones, not resets) was reset
  exactly once, with its task seed and its own session id; and nothing else was reset."""
  want = sorted((s.seed, s.session_id) for s in sessions if s.branch_of is None)
  assert sorted(log.calls) == want, (sorted(log.calls), want)


def rewards_by_session(sessions) -> dict:
  return {s.session_id: [float(t.reward) for t in s.turns] for s in sessions}


class ScriptedSampler:
  """A host-only stand-in with the `Sampler` API (no model, no jit).

  Each generated token is eos with probability `p_stop`, else a uniform digit;
  its state keeps every row's tokens so tests can compare the "cache" with the
  session records.
  """

  def __init__(self, tok=TOK, p_stop: float = 0.4, version: int = 0):
    self.tok, self.p_stop, self.version = tok, p_stop, version
    self.stop_ids = (tok.eos_id,)
    self.digit_ids = tok.encode("0123456789")
    self.last_state = None

  def init_state(self, batch, capacity):
    self.last_state = {"rows": tuple(() for _ in range(batch)), "capacity": capacity}
    return self.last_state

  def lengths(self, state):
    return np.array([len(r) for r in state["rows"]], np.int32)

  def append(self, state, new_tokens):
    rows = list(state["rows"])
    for b, new in enumerate(new_tokens):
      if len(rows[b]) + len(new) > state["capacity"]:
        raise ValueError(f"row {b} would overflow")
      rows[b] = rows[b] + tuple(int(x) for x in new)
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    return self.last_state

  def copy_rows(self, state, src_rows, dst_rows):
    """The tree engine's fork (rollout/tree.py): row dst starts as a copy of row src."""
    rows = list(state["rows"])
    for src, dst in zip(src_rows, dst_rows):
      rows[dst] = rows[src]
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    return self.last_state

  def generate(self, state, rng, max_new_tokens, active=None, params=None):
    import jax
    gen = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel().tolist())
    n = len(state["rows"])
    active = np.ones(n, bool) if active is None else np.asarray(active)
    rows = list(state["rows"])
    tokens, logps = [], []
    hit, cap = np.zeros(n, bool), np.zeros(n, bool)
    for b in range(n):
      ids, lp = [], []
      while active[b]:
        if len(ids) == max_new_tokens:
          hit[b] = True
          break
        if len(rows[b]) + len(ids) >= state["capacity"]:
          cap[b] = True
          break
        if gen.random() < self.p_stop:
          ids.append(self.tok.eos_id)
          lp.append(np.log(self.p_stop))
          break
        ids.append(int(gen.choice(self.digit_ids)))
        lp.append(np.log((1 - self.p_stop) / len(self.digit_ids)))
      rows[b] = rows[b] + tuple(ids)
      tokens.append(np.asarray(ids, np.int32))
      logps.append(np.asarray(lp, np.float32))
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    return SimpleNamespace(tokens=tokens, logps=logps, hit_budget=hit, ended_by_capacity=cap), self.last_state
