"""DAPO data-side tricks: dynamic sampling and overlong shaping."""
import jax
import numpy as np
import pytest
from hypothesis import given, settings

from credit_fixtures import random_sessions, seeds, to_batch
from mtrl_jax.credit import (collect_informative_groups, informative_group_mask,
                             informative_groups_np, make_credit_batch, overlong_penalty,
                             shape_overlong)


def test_overlong_penalty_dapo_numbers():
  # L_max 20480, L_buf 4096, factor 1: free up to 16384, -.5 at 18432,
  # -1 at 20480, held at -1 beyond.
  got = overlong_penalty(np.array([100, 16384, 18432, 20480, 30000]), 20480, 4096)
  np.testing.assert_allclose(got, [0, 0, -0.5, -1.0, -1.0])
  with pytest.raises(ValueError):
    overlong_penalty(1, 10, 20)


def test_shape_overlong_per_turn_hand_example():
  # Per-turn budget 4, buffer 2 (free up to 2 tokens). Turn 0 has 3 action
  # tokens -> -(3 - 2)/2 = -.5 on its last token; turn 1 has 1 token -> 0.
  mask = np.array([[0, 1, 1, 1, 0, 1]], np.float32)
  turn = np.array([[0, 0, 0, 0, 1, 1]])
  rew = np.array([[0, 0, 0, 1, 0, 2]], np.float32)
  batch = shape_overlong(make_credit_batch(rew, mask, turn), max_len=4, buffer_len=2)
  np.testing.assert_allclose(batch.reward_bt, [[0, 0, 0, 0.5, 0, 2]])
  np.testing.assert_allclose(batch.return_b, [2.5])


def test_shape_overlong_per_episode_hand_example():
  # Context cap 10, buffer 4, factor 2: a session of context length 8 gets
  # -(8 - 6)/4 * 2 = -1 on the last action token of its last turn; length 5 gets 0.
  # Session 0 is split over two rows (per-turn layout).
  mask = np.array([[1, 1, 0], [0, 0, 1], [1, 0, 0]], np.float32)
  turn = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 0]])
  rew = np.array([[0, 1, 0], [0, 0, 1], [3, 0, 0]], np.float32)
  batch = make_credit_batch(rew, mask, turn, episode_id_b=np.array([0, 0, 1]))
  np.testing.assert_allclose(batch.return_b, [2, 2, 3])
  out = shape_overlong(batch, max_len=10, buffer_len=4, factor=2.0, per="episode",
                       length_b=np.array([8, 8, 5]))
  np.testing.assert_allclose(out.reward_bt, [[0, 1, 0], [0, 0, 0], [3, 0, 0]])
  np.testing.assert_allclose(out.return_b, [1, 1, 3])


def test_dynamic_sampling_hand_example():
  # Groups 0 (1, 1) and 2 (2, 2) carry no signal; group 1 (0, 1) is kept.
  keep, dropped = informative_groups_np([0, 0, 1, 1, 2, 2], [1, 1, 0, 1, 2, 2])
  assert keep.tolist() == [False, False, True, True, False, False] and dropped == 2
  batch = make_credit_batch(np.zeros((6, 2)), np.ones((6, 2)),
                            group_id_b=np.array([0, 0, 1, 1, 2, 2]),
                            return_b=np.array([1, 1, 0, 1, 2, 2], np.float32))
  assert np.asarray(informative_group_mask(batch)).tolist() == keep.tolist()


def test_collect_informative_groups_loop():
  # Round 0: groups 0 (flat) and 1 (useful). Round 1: group 0 useful, group 1 flat.
  rounds = [
      {"group_id": np.array([0, 0, 1, 1]), "return": np.array([1.0, 1.0, 0.0, 1.0]),
       "tag": np.array([10, 11, 12, 13])},
      {"group_id": np.array([0, 0, 1, 1]), "return": np.array([0.0, 2.0, 5.0, 5.0]),
       "tag": np.array([20, 21, 22, 23])},
  ]
  out, stats = collect_informative_groups(lambda i: rounds[i], groups_needed=2, max_rounds=5)
  assert out["tag"].tolist() == [12, 13, 20, 21]
  assert out["group_id"].tolist() == [0, 0, 1, 1]
  assert stats == {"rounds": 2, "dropped_groups": 2, "kept_groups": 2}
  # Bound on rounds: asking for 3 groups stops after max_rounds, short.
  _, stats = collect_informative_groups(lambda i: rounds[i % 2], groups_needed=9, max_rounds=3)
  assert stats["rounds"] == 3 and stats["kept_groups"] == 3


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_jit_mask_agrees_with_host_helper(seed):
  d = random_sessions(seed, n_groups=3)
  rng = np.random.default_rng(seed)
  d["return_b"] = rng.integers(0, 2, size=len(d["return_b"])).astype(np.float32)
  keep, _ = informative_groups_np(d["group_id_b"], d["return_b"])
  got = jax.jit(informative_group_mask)(to_batch(d))
  assert np.asarray(got).tolist() == keep.tolist()
