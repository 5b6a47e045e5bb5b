"""Continuous batching against the lockstep engine (the reference), with the
real jitted sampler and a random tiny policy; group prefill in both engines."""
import functools

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_fixtures import (TOK, CountEnv, LoggedDelayed, ResetLog, assert_reset_with_session_ids,
                              rewards_by_session)
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.group_prefill import leaders
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

# One layer: the tests pay mostly for compiles, which grow with depth.
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
# eos and 64 more stop ids: the policy's actions end after anything from 1
# token to the budget, as real actions of different lengths do.
STOPS = [TOK.eos_id] + list(range(32, 96))
BUDGET, CAP, G = 16, 128, 2
TASKS = [11, 12, 13, 14]


class LongPromptEnv(CountEnv):
  """CountEnv with a 40-character prompt (what group prefill saves) and 3 turns."""

  def _reset(self, seed):
    r = super()._reset(seed)
    return r._replace(prompt="count up from the number shown, one per turn")


@pytest.fixture(scope="module")
def sampler():
  policy = Transformer(CFG, rngs=nnx.Rngs(4))
  # Logits several nats apart (tied embeddings x 8): a wrong cache row changes
  # the sampled tokens, not only their log-probs.
  policy.embed[...] = policy.embed[...] * 8
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=STOPS, log_compiles=False, version=5)


def _kw(**kw):
  return {"group_size": G, "turn_token_budget": BUDGET, "context_cap": CAP, "num_env_threads": 4,
          "env_name": "count", "sampling": SamplingParams(temperature=1.2), **kw}


def _lockstep(sampler, env=LongPromptEnv, **kw):
  return RolloutEngine(sampler, TOK, env, **_kw(**kw)).run(TASKS, jax.random.key(3))


def _continuous(sampler, env=LongPromptEnv, rows=2, in_flight=6, chunk=4, **kw):
  eng = ContinuousEngine(sampler, TOK, env, rows=rows, in_flight=in_flight, chunk=chunk, **_kw(**kw))
  eng.trace = []
  return eng, eng.run(TASKS, jax.random.key(3))


def assert_same_sessions(a, b, atol=1e-5):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    dx, dy = x.to_dict(), y.to_dict()
    tx, ty = dx.pop("turns"), dy.pop("turns")
    assert dx == dy
    assert len(tx) == len(ty)
    for p, q in zip(tx, ty):
      lp, lq = p.pop("logp"), q.pop("logp")
      assert p == q  # ids, text, versions, rewards, flags
      np.testing.assert_allclose(lp, lq, atol=atol)


@pytest.fixture(scope="module")
def reference(sampler):
  return _lockstep(sampler)


def test_continuous_sessions_equal_lockstep(sampler, reference):
  """2 decode rows for 8 sessions, 6 live at once (so sessions waiting on their
  env are parked off their rows and loaded back into other rows), 4 decode
  steps per call: every session equals the lockstep engine's (tokens, texts,
  versions, rewards, end reasons; log-probs to 1e-5), and the ledgers agree.

  Breaks checked: a waiting session's row parked into the wrong store row, or
  loaded back from the wrong one: log-probs differ by ~5e-3 (tolerance 1e-5;
  this tiny policy's next token barely depends on the context); the row key
  folded with the row index instead of the session's turn: tokens differ.
  """
  assert len({len(t.action_ids) for s in reference.sessions for t in s.turns}) > 4  # mixed lengths
  spy = AppendSpy(sampler)
  eng, res = _continuous(spy)
  assert spy.parked > 0 and spy.loaded > 0  # the parking path ran
  assert_same_sessions(reference.sessions, res.sessions)
  res.ledger.check(res.sessions)
  for name in ("generated_total", "prefilled_total", "sessions", "turns"):
    assert getattr(res.ledger, name) == getattr(reference.ledger, name), name
  np.testing.assert_array_equal(res.ledger.generated_by_turn, reference.ledger.generated_by_turn)
  assert {c.version for c in eng.trace} == {5}


def test_rows_are_refilled_without_waiting_for_the_batch(sampler, reference):
  """Work conservation: at every decode call, either all rows decode or no
  session with its observation ready is left without a row; and the decode
  slot utilisation (generated tokens / rows x steps, from the ledger) is far
  above the lockstep engine's on the same sessions.

  Break checked: refilling rows only once every row is idle (`_take_row`
  returns None while any row decodes): the invariant fails (calls with idle
  rows and waiting sessions) and utilisation drops to lockstep's level.
  """
  eng, res = _continuous(sampler)
  assert eng.trace and sum(c.tokens for c in eng.trace) == res.ledger.generated_total
  for c in eng.trace:
    assert c.active == c.rows or c.unplaced == 0, c
  lock, cont = reference.ledger.slot_utilisation, res.ledger.slot_utilisation
  # Lockstep: every row pays for the longest action of each turn, and finished rows idle.
  assert lock < 0.6 and cont > lock + 0.2, (lock, cont)


def test_group_prefill_saves_the_shared_prompt_and_changes_no_session(sampler, reference):
  """One prefill per group, in both engines: sessions equal the unshared run;
  the ledger counts (G - 1) x the first observation's tokens per group as
  saved, and the tokens really sent through `append` (counted by a spy on the
  sampler) are the unshared count minus the saved ones. The continuous engine
  runs twice: one group live at a time (followers copy the leader's row into
  a free row) and three (followers are parked in the store).

  Breaks checked: followers copy the wrong row (`(follow[r] + 2) % batch` in
  `append_once_per_group`; the leader's row + 1 in `_fork_followers`, for the
  free-row copies and for the parked ones): log-probs differ by ~5e-3
  (tolerance 1e-5) or an empty row is decoded (ValueError); saved tokens not recorded (either engine):
  `ledger.check` fails and the counts differ from the spy's.
  """
  first = {s.session_id: len(s.turns[0].obs_ids) for s in reference.sessions}
  expect_saved = sum(first[s.session_id] for i, s in enumerate(reference.sessions) if i % G)
  assert expect_saved >= 40 * len(TASKS)  # the prompt alone is 40+ tokens

  spy = AppendSpy(sampler)
  runs = [RolloutEngine(spy, TOK, LongPromptEnv, group_prefill=True, **_kw()).run(TASKS, jax.random.key(3))]
  sent = [spy.total]
  copies = []
  for in_flight in (2, 6):
    before = (spy.total, spy.copied, spy.parked)
    runs.append(_continuous(spy, group_prefill=True, in_flight=in_flight)[1])
    sent.append(spy.total - before[0])
    copies.append((spy.copied - before[1], spy.parked - before[2]))
  assert copies[0][0] == len(TASKS) * (G - 1) and copies[0][1] == 0  # one group at a time: row copies
  assert copies[1][1] > 0  # three groups at once: followers parked
  for res, n_sent in zip(runs, sent):
    assert_same_sessions(reference.sessions, res.sessions)
    res.ledger.check(res.sessions)
    assert res.ledger.prefill_saved_total == expect_saved
    assert res.ledger.prefill_saved_by_turn.tolist()[0] == expect_saved
    assert res.ledger.prefilled_total == reference.ledger.prefilled_total - expect_saved == n_sent


class AppendSpy:
  """The sampler, counting the tokens sent through `append` and the rows moved
  to (parked) and from (loaded) the parking store."""

  def __init__(self, inner):
    self.inner, self.total, self.parked, self.loaded, self.copied = inner, 0, 0, 0, 0

  def copy_rows(self, state, src_rows, dst_rows):
    self.copied += len(dst_rows)
    return self.inner.copy_rows(state, src_rows, dst_rows)

  def move_rows(self, src, src_rows, dst, dst_rows):
    if dst.last_logits_bv.shape[0] > src.last_logits_bv.shape[0]:  # into the (larger) store
      self.parked += len(dst_rows)
    else:
      self.loaded += len(dst_rows)
    return self.inner.move_rows(src, src_rows, dst, dst_rows)

  def append(self, state, new_tokens, **kw):
    self.total += sum(len(t) for t in new_tokens)
    return self.inner.append(state, new_tokens, **kw)

  def append_rows(self, state, rows, new_tokens, **kw):
    self.total += sum(len(t) for t in new_tokens)
    return self.inner.append_rows(state, rows, new_tokens, **kw)

  def __getattr__(self, name):
    return getattr(self.inner, name)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 3), max_size=3)), max_size=8))
def test_leaders_share_only_equal_ids_within_a_group(items):
  """Oracle: a key follows the smallest earlier key with the same group and ids."""
  first_ids = {k: ids for k, (_, ids) in enumerate(items)}
  group = {k: g for k, (g, _) in enumerate(items)}
  got = leaders(first_ids, group.get)
  for k in first_ids:
    earlier = [j for j in range(k) if group[j] == group[k] and list(first_ids[j]) == list(first_ids[k])]
    if earlier:
      assert got[k] == earlier[0]
    else:
      assert k not in got


def test_every_reset_gets_its_session_id_and_a_per_session_probe_repeats(sampler):
  """Continuous batching on `delayed` (per-session noise, envs/session_noise.py), sessions parked
  and refilled as in the tests above: every env reset receives its task seed and its own session
  id; two runs at one key give the same sessions; the two sessions of a group (one seed) draw
  different noise.
  Break checked: `env.reset(s.seed)` in the continuous engine's reset (the session id dropped:
  the probe draws from the operating system) fails the reset log, and the equality of the two
  runs on its own."""
  runs = []
  for _ in range(2):
    log = ResetLog()
    res = _continuous(sampler, env=lambda: LoggedDelayed(log, horizon=3))[1]
    assert_reset_with_session_ids(log, res.sessions)
    runs.append(res.sessions)
  assert_same_sessions(runs[0], runs[1])
  assert all(s.num_turns == 3 for s in runs[0])  # 2 noise draws and a payoff each
  rewards = list(rewards_by_session(runs[0]).values())  # task-major: a group's G sessions in a row
  assert any(rewards[i] != rewards[i + 1] for i in range(0, len(rewards), G))


def test_continuous_engine_checks_its_arguments(sampler):
  for kw, msg in (({"rows": -1}, "rows"), ({"chunk": 0}, "chunk"), ({"in_flight": -2}, "in_flight")):
    with pytest.raises(ValueError, match=msg):
      ContinuousEngine(sampler, TOK, LongPromptEnv, **_kw(**kw))


def test_env_errors_and_context_cap_end_only_their_sessions(sampler):
  """A failing reset, a failing step and a context cap hit mid-run: the
  continuous engine ends those sessions as the lockstep engine does and plays
  the rest to the end (same sessions)."""
  env = functools.partial(FlakyEnv)
  ref = RolloutEngine(sampler, TOK, env, **_kw(context_cap=110)).run(TASKS, jax.random.key(3))
  _, res = _continuous(sampler, env=env, context_cap=110)
  reasons = {s.end_reason for s in ref.sessions}
  assert {"env_error", "context_cap"} <= reasons, reasons
  assert_same_sessions(ref.sessions, res.sessions)
  res.ledger.check(res.sessions)


class FlakyEnv(LongPromptEnv):
  """Seed 12 fails its reset, seed 13 its second step; 6 turns so caps are hit."""

  def __init__(self):
    super().__init__(horizon=6)

  def _reset(self, seed):
    if seed == 12:
      raise RuntimeError("reset failed")
    return super()._reset(seed)

  def _step(self, action):
    if self.seed == 13 and self.turn == 1:
      raise RuntimeError("step failed")
    return super()._step(action)
