import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.rollout.packing import bucket_length, pack_sessions
from mtrl_jax.rollout.session import Session, make_turn
from rollout_fixtures import ACTION_IDS, TOK, session_lists_st

LAYOUTS = [("session", "history"), ("turn", "history"), ("turn", "markov")]


def _expected_rows(sessions, layout, context):
  """(session index, turn or -1, input tokens, action ids, logps, versions) per sample."""
  rows = []
  for i, s in enumerate(sessions):
    if layout == "session":
      rows.append((i, -1, s.flat_tokens(), [t for t in s.turns]))
      continue
    history = []
    for k, t in enumerate(s.turns):
      if context == "history":
        tokens = np.concatenate(history + [t.obs_ids, t.action_ids])
        history += [t.obs_ids, t.action_ids]
      else:
        tokens = np.concatenate([TOK.observation_ids(t.observation, s.prompt), t.action_ids])
      rows.append((i, k, tokens, [t]))
  return rows


def _check_batch(sessions, batch, layout, context, multiple):
  b, t = batch.shape
  rows = _expected_rows(sessions, layout, context)
  assert b % multiple == 0 and b >= len(rows)
  assert t == bucket_length(max(len(r[2]) for r in rows))
  for name, arr in batch._asdict().items():
    assert arr.shape[0] == b, name
    if name.endswith("_bt"):
      assert arr.shape == (b, t), name
  for r, (i, k, tokens, turns) in enumerate(rows):
    n = len(tokens)
    assert batch.session_index_b[r] == i and batch.sample_turn_b[r] == k
    assert batch.length_b[r] == n
    assert np.array_equal(batch.tokens_bt[r, :n], tokens)
    assert np.array_equal(batch.targets_bt[r, :n - 1], tokens[1:])
    assert np.array_equal(batch.positions_bt[r, :n], np.arange(n))
    m = batch.loss_mask_bt[r] == 1
    # Loss only where the target is a generated token, and never past the row.
    assert set(np.unique(batch.loss_mask_bt[r])) <= {0.0, 1.0}
    assert not m[n - 1:].any()
    assert set(batch.targets_bt[r][m].tolist()) <= ACTION_IDS
    # Exactly the generated tokens of the trained turns, in order, with their logps/versions.
    assert batch.targets_bt[r][m].tolist() == np.concatenate([x.action_ids for x in turns]).tolist()
    assert np.array_equal(batch.behav_logp_bt[r][m], np.concatenate([x.logp for x in turns]))
    assert np.array_equal(batch.version_bt[r][m], np.concatenate([x.version for x in turns]))
    assert np.all(batch.behav_logp_bt[r][~m] == 0) and np.all(batch.version_bt[r][~m] == -1)
    # Each trained turn's reward sits on its last generated token.
    ends = np.flatnonzero(m & ~np.append(m[1:], False))
    assert len(ends) == len(turns)
    assert np.allclose(batch.reward_bt[r][ends], [x.reward for x in turns])
    assert np.all(batch.reward_bt[r][~m] == 0)
    if k >= 0:
      assert np.all(batch.turn_idx_bt[r][m] == k)
    s = sessions[i]
    assert batch.return_b[r] == np.float32(s.episode_return)
    assert batch.success_b[r] == float(s.success) and batch.num_turns_b[r] == s.num_turns
    assert batch.sample_valid_b[r] == 1
  pad = batch.sample_valid_b == 0
  assert pad.sum() == b - len(rows)
  assert np.all(batch.loss_mask_bt[pad] == 0) and np.all(batch.reward_bt[pad] == 0)
  # Dense ids: in [0, B); equal exactly when the sessions' ids are equal.
  for field, key in (("group_id_b", "group_id"), ("tree_id_b", "tree_id"), ("episode_id_b", "session_id")):
    ids = getattr(batch, field)
    assert ids.min() >= 0 and ids.max() < b
    real = [getattr(sessions[rows[r][0]], key) for r in range(len(rows))]
    for a in range(b):
      for c in range(b):
        same = a < len(rows) and c < len(rows) and real[a] == real[c]
        assert (ids[a] == ids[c]) == (same or a == c), (field, a, c)


@settings(max_examples=40, deadline=None)
@given(session_lists_st(), st.sampled_from(LAYOUTS), st.sampled_from([1, 4]))
def test_packing_properties(sessions, layout_context, multiple):
  layout, context = layout_context
  batch = pack_sessions(sessions, layout=layout, context=context, tokenizer=TOK, batch_multiple=multiple)
  _check_batch(sessions, batch, layout, context, multiple)


def test_token_logprobs_line_up_with_targets():
  """logp from logits at position i is scored against target i (the next input token)."""
  import jax.numpy as jnp
  from mtrl_jax.models.transformer import token_logprobs
  s = Session(session_id=0, task_id=0, group_id=0, seed=0, env_name="x", prompt="p")
  s.turns.append(make_turn("o", TOK.observation_ids("o", "p"), "AB", TOK.encode("AB") + [2], [-1., -2., -3.], 0, 1.0))
  s.finish("terminated")
  batch = pack_sessions([s])
  # Logits that put all mass on the NEXT input token give logp 0 exactly where the mask is 1.
  b, t = batch.shape
  nxt = np.concatenate([batch.tokens_bt[:, 1:], np.zeros((b, 1), np.int32)], axis=1)
  logits = jnp.where(jnp.arange(TOK.vocab_size)[None, None, :] == nxt[..., None], 50.0, 0.0)
  logp = np.asarray(token_logprobs(logits, jnp.asarray(batch.targets_bt)))
  m = batch.loss_mask_bt == 1
  assert m.sum() == 3 and np.allclose(logp[m], 0.0, atol=1e-6)


def test_buckets_and_errors():
  assert [bucket_length(n) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
  assert bucket_length(20, [24, 48]) == 24
  with pytest.raises(ValueError, match="length_buckets"):
    bucket_length(60, [24, 48])
  s = Session(session_id=0, task_id=0, group_id=0, seed=0, env_name="x")
  s.finish("env_error", error="boom")
  with pytest.raises(ValueError, match=r"sessions\[0\].*not trainable"):
    pack_sessions([s])
  with pytest.raises(ValueError, match="layout"):
    pack_sessions([], layout="tree")
  with pytest.raises(ValueError, match="tokenizer"):
    pack_sessions([], layout="turn", context="markov")


def test_min_batch_pads_with_fresh_ids():
  s = Session(session_id=9, task_id=0, group_id=4, seed=0, env_name="x")
  s.turns.append(make_turn("o", TOK.observation_ids("o", ""), "A", TOK.encode("A"), [-1.0], 0, 1.0, cut_at_budget=True))
  s.finish("truncated")
  batch = pack_sessions([s], min_batch=3, batch_multiple=2, length_buckets=[8, 32])
  assert batch.shape == (4, 8)
  assert batch.sample_valid_b.tolist() == [1, 0, 0, 0]
  assert sorted(batch.episode_id_b.tolist()) == [0, 1, 2, 3]
  assert batch.loss_mask_bt[1:].sum() == 0 and batch.session_index_b[1:].tolist() == [-1, -1, -1]


def _with_turn_info(sessions, seed):
  """Copies of `sessions` whose turns carry a state key (from a small set, or
  none) and a turn reward in their info, as the envs report them."""
  import copy
  rng = np.random.default_rng(seed)
  out = []
  for s in sessions:
    s = copy.deepcopy(s)
    s.turns = [t._replace(info={**t.info, "turn_reward": float(rng.integers(0, 3)),
                                **({} if rng.random() < 0.25 else {"state_key": f"s{rng.integers(0, 3)}"})})
               for t in s.turns]
    out.append(s)
  return out


@settings(max_examples=30, deadline=None)
@given(session_lists_st(), st.sampled_from(LAYOUTS), st.integers(0, 2**31 - 1))
def test_state_keys_and_turn_rewards_travel_to_the_batch(sessions, layout_context, seed):
  """Every trained turn's tokens carry the id of its state key (one id per
  distinct key, -1 where there is none) and its turn reward sits on its last
  action token, in every layout. Break checked: the markov layout reading
  the state id of the row's first token (turn 0's) instead of the turn's
  fails; ids per row instead of per batch fail the "same key, same id" check."""
  layout, context = layout_context
  sessions = _with_turn_info(sessions, seed)
  batch = pack_sessions(sessions, layout=layout, context=context, tokenizer=TOK)
  rows = _expected_rows(sessions, layout, context)
  seen = {}
  for r, (i, k, tokens, turns) in enumerate(rows):
    m = batch.loss_mask_bt[r] == 1
    ends = np.flatnonzero(m & ~np.append(m[1:], False))
    assert np.allclose(batch.turn_reward_bt[r][ends], [t.info["turn_reward"] for t in turns])
    assert np.all(batch.turn_reward_bt[r][~m] == 0)
    starts = np.flatnonzero(m & ~np.insert(m[:-1], 0, False))
    for t, a, e in zip(turns, starts, ends):
      ids = batch.state_id_bt[r][a:e + 1]
      assert np.all(ids == ids[0])
      key = t.info.get("state_key")
      if key is None:
        assert ids[0] == -1
      else:
        assert seen.setdefault(key, int(ids[0])) == ids[0] and ids[0] >= 0
  assert len(set(seen.values())) == len(seen)  # different keys, different ids
  assert np.all(batch.state_id_bt[batch.sample_valid_b == 0] == -1)


@settings(max_examples=30, deadline=None)
@given(session_lists_st(), st.sampled_from(LAYOUTS), st.integers(0, 2**31 - 1))
def test_invalid_replies_travel_to_the_batch_on_their_turns_tokens(sessions, layout_context, seed):
  """`invalid_bt` is True exactly on the tokens whose turn (`turn_idx_bt`) the env called invalid, in
  every layout (a history row's earlier turns keep their flags), and False on padding. Breaks
  checked: the flag dropped in packing (`invalid` left all False) fails; the markov rows flagged
  with turn 0's `invalid_action` instead of their own turn's fails."""
  import copy
  rng = np.random.default_rng(seed)
  sessions = copy.deepcopy(sessions)
  for s in sessions:
    s.turns = [t._replace(invalid_action=bool(rng.random() < 0.5)) for t in s.turns]
  layout, context = layout_context
  batch = pack_sessions(sessions, layout=layout, context=context, tokenizer=TOK, batch_multiple=4)
  assert batch.invalid_bt.dtype == bool
  for r, (i, k, tokens, turns) in enumerate(_expected_rows(sessions, layout, context)):
    n = len(tokens) - 1  # target-aligned: the last input token has no target
    want = [sessions[i].turns[x].invalid_action for x in batch.turn_idx_bt[r, :n]]
    assert batch.invalid_bt[r, :n].tolist() == want
    assert not batch.invalid_bt[r, n:].any()
  assert not batch.invalid_bt[batch.sample_valid_b == 0].any()
