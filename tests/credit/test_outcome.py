"""Outcome estimators: grpo, ms_grpo, rloo, tree."""
import math

import numpy as np
import pytest
from hypothesis import given, settings

from credit_fixtures import jitted, random_sessions, seeds, split_per_turn, to_batch, run
from mtrl_jax.credit import make_credit_batch
from mtrl_jax.credit.outcome import episode_group_advantage


def _one_token_rows(returns, group, episode=None, tree=None):
  """Rows of 3 tokens: [obs, action, action]; the reward is irrelevant here."""
  n = len(returns)
  mask = np.tile(np.array([0, 1, 1], np.float32), (n, 1))
  return make_credit_batch(np.zeros((n, 3)), mask, group_id_b=np.array(group),
                           episode_id_b=None if episode is None else np.array(episode),
                           tree_id_b=None if tree is None else np.array(tree),
                           return_b=np.array(returns, np.float32))


def test_grpo_hand_example():
  # Group 5: returns 3, 1 -> mean 2, std 1 -> A = +1, -1.
  # Group 9: returns 2, 2, 5 -> mean 3, deviations -1, -1, 2,
  #   var = (1 + 1 + 4) / 3 = 2, std = sqrt 2 -> A = -1/sqrt2, -1/sqrt2, sqrt2.
  batch = _one_token_rows([3, 1, 2, 2, 5], [5, 5, 9, 9, 9])
  adv, target = run("grpo", batch, eps=0.0)
  r2 = math.sqrt(2.0)
  expect = np.array([1, -1, -1 / r2, -1 / r2, r2], np.float32)
  np.testing.assert_allclose(adv[:, 1], expect, rtol=1e-6)
  np.testing.assert_allclose(adv[:, 2], expect, rtol=1e-6)
  assert np.all(np.asarray(adv[:, 0]) == 0.0)  # the observation token
  assert target is None


def test_grpo_without_std_and_unbiased_std():
  # Dr. GRPO: A = R - mean = 1, -1 for returns 3, 1.
  batch = _one_token_rows([3, 1], [0, 0])
  adv, _ = run("grpo", batch, scale_by_std=False)
  np.testing.assert_allclose(adv[:, 1], [1.0, -1.0])
  # ddof=1: var = (1 + 1) / 1 = 2 -> A = +-1/sqrt2.
  adv, _ = run("grpo", batch, eps=0.0, ddof=1)
  np.testing.assert_allclose(adv[:, 1], [1 / math.sqrt(2), -1 / math.sqrt(2)], rtol=1e-6)


def test_ms_grpo_per_turn_counts_each_episode_once():
  # Episode 10 spans 3 rows (return 1), episode 11 spans 2 rows (return 0).
  # Counting episodes: mean 0.5, std 0.5 -> A = +1 / -1 on every turn.
  # (Counting rows would give mean 3/5 and different numbers.)
  batch = _one_token_rows([1, 1, 1, 0, 0], [0] * 5, episode=[10, 10, 10, 11, 11])
  adv, target = run("ms_grpo", batch, eps=0.0, context="markov")
  np.testing.assert_allclose(adv[:, 1], [1, 1, 1, -1, -1], rtol=1e-6)
  assert target is None


def test_rloo_hand_example():
  # Group 0 returns 1, 2, 6: A = 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - 1.5 = 4.5.
  # Group 1 has a single session: no baseline -> 0.
  batch = _one_token_rows([1, 2, 6, 7], [0, 0, 0, 1])
  adv, target = run("rloo", batch)
  np.testing.assert_allclose(adv[:, 2], [-3.0, -1.5, 4.5, 0.0])
  assert target is None


def test_tree_hand_example():
  # One group, returns 4, 0, 2, 2; trees {0, 1} and {2, 3}.
  # Group: mean 2, dev 2, -2, 0, 0, var 8/4 = 2 -> sqrt2, -sqrt2, 0, 0.
  # Tree A (4, 0): mean 2, std 2 -> 1, -1. Tree B (2, 2): 0, 0.
  batch = _one_token_rows([4, 0, 2, 2], [0, 0, 0, 0], tree=[7, 7, 3, 3])
  adv, _ = run("tree", batch, eps=0.0)
  r2 = math.sqrt(2.0)
  np.testing.assert_allclose(adv[:, 1], [r2 + 1, -r2 - 1, 0, 0], rtol=1e-6, atol=1e-7)


def test_padding_rows_do_not_enter_group_statistics():
  # Third row has no action token: its return 100 must not move the mean.
  mask = np.array([[1, 1], [1, 1], [0, 0]], np.float32)
  batch = make_credit_batch(np.zeros((3, 2)), mask, group_id_b=np.zeros(3, np.int32),
                            return_b=np.array([3.0, 1.0, 100.0]))
  adv, _ = run("grpo", batch, eps=0.0)
  np.testing.assert_allclose(adv, [[1, 1], [-1, -1], [0, 0]], rtol=1e-6)


def _group_means(adv_e, group_e):
  return [adv_e[group_e == g].mean() for g in np.unique(group_e)]


@settings(max_examples=30, deadline=None)
@given(seed=seeds)
def test_group_normalised_advantages_have_zero_mean_per_group(seed):
  d = random_sessions(seed, n_groups=3, pad_row=seed % 2 == 0)
  batch = to_batch(d)
  valid = d["loss_mask_bt"].sum(1) > 0
  first_tok = np.argmax(d["loss_mask_bt"], axis=1)
  for name in ("grpo", "ms_grpo", "rloo"):
    adv, _ = jitted(name)(batch)
    adv_e = np.asarray(adv)[np.arange(len(first_tok)), first_tok][valid]
    for mean in _group_means(adv_e, d["group_id_b"][valid]):
      assert abs(mean) < 1e-4, (name, mean)


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_ms_grpo_gives_every_turn_of_an_episode_the_same_advantage(seed):
  d = random_sessions(seed, n_groups=2)
  per_turn, origin = split_per_turn(d, seed, pad_rows_to=72)
  adv, _ = jitted("ms_grpo")(to_batch(per_turn))
  adv = np.asarray(adv)
  mask = per_turn["loss_mask_bt"] > 0
  by_episode = {}
  for j, o in enumerate(origin):
    if o is None:
      assert np.all(adv[j] == 0.0)
      continue
    vals = adv[j][mask[j]]
    assert np.all(vals == vals[0])
    by_episode.setdefault(o[0], set()).add(float(vals[0]))
  assert all(len(v) == 1 for v in by_episode.values())
  # ... and it equals the advantage of the whole session in the session layout.
  adv_s, _ = jitted("ms_grpo")(to_batch(d))
  for i, vals in by_episode.items():
    first = np.argmax(d["loss_mask_bt"][i])
    np.testing.assert_allclose(vals.pop(), np.asarray(adv_s)[i, first], rtol=1e-5, atol=1e-6)


def test_ms_grpo_rejects_unknown_context():
  with pytest.raises(ValueError, match="context"):
    run("ms_grpo", _one_token_rows([1, 0], [0, 0]), context="bogus")


def test_episode_group_advantage_defaults_population_std_small_eps():
  """Defaults eps 1e-6, scale_by_std True, ddof 0 (aaw calls it directly).
  Returns 6, 2: deviation +-2, population std 2 -> +-2 / (2 + 1e-6).
  Catches a changed default: eps 1.000001 gives +-0.67, scale_by_std False
  +-2, ddof 1 +-0.71."""
  adv_e, table = episode_group_advantage(_one_token_rows([6, 2], [0, 0]))
  expect = np.array([2, -2]) / (2 + 1e-6)
  np.testing.assert_allclose(np.asarray(adv_e)[np.asarray(table.ep_b)], expect, rtol=1e-7)
  assert abs(float(adv_e[0]) - 1.0) > 1e-7  # eps is there


def test_ms_grpo_passes_scale_by_std_through():
  """ms_grpo(scale_by_std=False) is Dr. GRPO: returns 6, 2 -> +-2 (with the
  std division it would be +-1). Catches ms_grpo dropping the option."""
  adv, _ = run("ms_grpo", _one_token_rows([6, 2], [0, 0]), scale_by_std=False)
  np.testing.assert_allclose(adv[:, 1], [2.0, -2.0])
