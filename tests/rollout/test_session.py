import numpy as np
import pytest
from hypothesis import given, settings

from mtrl_jax.rollout.session import Session, make_turn
from rollout_fixtures import ACTION_IDS, TOK, sessions_st


@settings(max_examples=40, deadline=None)
@given(sessions_st())
def test_flat_views_follow_the_token_layout(s):
  expected = []
  for k, t in enumerate(s.turns):
    expected += TOK.observation_ids(t.observation, s.prompt if k == 0 else None)
    expected += t.action_ids.tolist()
  tokens = s.flat_tokens()
  assert tokens.tolist() == expected
  mask = s.loss_mask()
  assert mask.shape == tokens.shape
  # The fixture draws action ids from a disjoint alphabet: the mask is exactly that set.
  assert np.array_equal(mask == 1, np.isin(tokens, list(ACTION_IDS)))
  assert np.array_equal(s.flat_logp()[mask == 1], np.concatenate([t.logp for t in s.turns]))
  assert np.all(s.flat_logp()[mask == 0] == 0)
  assert np.all(s.flat_version()[mask == 0] == -1)
  assert np.isclose(s.flat_reward().sum(), s.episode_return, atol=1e-5)
  assert s.num_action_tokens == int(mask.sum())
  assert s.num_obs_tokens + s.num_action_tokens == len(tokens)


def test_trainable_and_versions():
  s = Session(session_id=3, task_id=1, group_id=1, seed=1, env_name="x", prompt="p")
  assert not s.trainable  # not finished, no tokens
  assert s.min_version() is None
  s.turns.append(make_turn("o", TOK.observation_ids("o", "p"), "a", [TOK.encode("a")[0], 2], [-1.0, -0.5], 4, 1.0))
  s.turns.append(make_turn("o2", TOK.observation_ids("o2"), "b", [TOK.encode("b")[0], 2], [-1.0, -0.5], 6, 0.0))
  s.finish("terminated", success=True)
  assert s.trainable and s.terminated and not s.env_error
  assert (s.min_version(), s.max_version()) == (4, 6)
  assert s.tree_id == 3 and s.branch_of is None
  s.finish("env_error", error="boom")
  assert not s.trainable and s.env_error


def test_bad_fields_are_named():
  with pytest.raises(ValueError, match="end_reason"):
    Session(session_id=0, task_id=0, group_id=0, seed=0, env_name="x", end_reason="done")
  with pytest.raises(ValueError, match="logp"):
    make_turn("o", [3], "a", [10, 2], [-1.0], 0, 0.0)


@settings(max_examples=20, deadline=None)
@given(sessions_st())
def test_dict_round_trip(s):
  back = Session.from_dict(s.to_dict())
  assert back.to_dict() == s.to_dict()
  assert np.array_equal(back.flat_tokens(), s.flat_tokens())
  assert back.flat_tokens().dtype == np.int32 and back.flat_logp().dtype == np.float32
