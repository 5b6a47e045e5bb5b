"""mt_grpo and progress: hand-worked examples, numpy oracles on random groups
(both layouts), constant groups, and what they fall back to."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_fixtures import random_sessions, run, run_traced, seeds, split_per_turn, to_batch
from mtrl_jax.credit import compute_advantages, make_credit_batch

_MASK = np.tile(np.array([0, 1, 0, 1], np.float32), (3, 1))
_TURN = np.tile(np.array([0, 0, 1, 1], np.int32), (3, 1))
_REW = np.array([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1]], np.float32)
_TURN_REWARD = np.array([[0, 1, 0, 1], [0, 0, 0, 1], [0, 1, 0, 1]], np.float32)


def _hand_batch():
  return make_credit_batch(_REW, _MASK, _TURN, group_id_b=np.zeros(3, np.int32),
                           turn_reward_bt=_TURN_REWARD)


def test_mt_grpo_hand_example():
  """docs/credit.md's example (eps 0): A^O = 0.7071, -1.4142, 0.7071; turn
  rewards (1, 1), (0, 1), (1, 1): turn 0 normalises to 0.7071, -1.4142,
  0.7071, turn 1 (all equal) to 0.
  Break checked: the turn term normalised over all six turns of the group
  (ignoring the turn index: mean 5/6) gives turn 0 0.4472 ... and fails; so
  does reading the turn reward from `reward_bt`."""
  r2 = math.sqrt(2.0)
  h = 1 / r2
  adv, tgt = run("mt_grpo", _hand_batch(), eps=0.0)
  np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]], [[r2, h], [-2 * r2, -r2], [r2, h]], rtol=1e-5)
  assert tgt is None
  # The weights: outcome 0.5, turn 2.
  adv, _ = run("mt_grpo", _hand_batch(), eps=0.0, outcome_weight=0.5, turn_weight=2.0)
  np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]],
                             [[2.5 * h, 0.5 * h], [-2.5 * r2, -0.5 * r2], [2.5 * h, 0.5 * h]], rtol=1e-5)


def test_mt_grpo_turn_credit_hand_example():
  """The three ways to combine turns, without the outcome term. Turn-0
  normalised u: (0.7071, -1.4142, 0.7071); turn 1: (0, 0, 0) (all 1).
  own: those. normalise_then_sum, turn 0: 0.7071 + 0, ... (turn 1 adds 0).
  sum_then_normalise, turn 0: u to go = 2, 1, 2 -> 0.7071, -1.4142, 0.7071.
  With the second turn's rewards (1, 1, 0) instead: turn 1 normalises to
  0.7071, 0.7071, -1.4142; normalise_then_sum at turn 0 = 1.4142, -0.7071,
  -0.7071, and sum_then_normalise (to go 2, 1, 1) the same; 'own' keeps
  turn 0's 0.7071, -1.4142, 0.7071. (The two sums differ when sessions end
  at different turns: next test.)
  Break checked: normalise_then_sum summing towards the start (a forward
  cumulative sum) gives turn 1 the sum and fails."""
  h = 1 / math.sqrt(2.0)
  r2 = 2 * h
  for credit in ("own", "normalise_then_sum", "sum_then_normalise"):
    adv, _ = run("mt_grpo", _hand_batch(), eps=0.0, outcome_weight=0.0, turn_credit=credit)
    np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]], [[h, 0], [-r2, 0], [h, 0]],
                               rtol=1e-5, atol=1e-6, err_msg=credit)
  u = _TURN_REWARD.copy()
  u[2, 3] = 0.0
  batch = _hand_batch()._replace(turn_reward_bt=np.asarray(u))
  for credit, turn0 in (("own", [h, -r2, h]), ("normalise_then_sum", [r2, -h, -h]),
                        ("sum_then_normalise", [r2, -h, -h])):
    adv, _ = run("mt_grpo", batch, eps=0.0, outcome_weight=0.0, turn_credit=credit)
    np.testing.assert_allclose(np.asarray(adv)[:, 1], turn0, rtol=1e-5, atol=1e-6, err_msg=credit)
    np.testing.assert_allclose(np.asarray(adv)[:, 3], [h, h, -r2], rtol=1e-5, atol=1e-6, err_msg=credit)


def test_early_exit_separates_the_three_turn_credits():
  """Session 1 stops after turn 0 with reward 0.3; sessions 2 and 3 carry on
  and get 1 and 0 at turn 1 (turn_signal='reward', mean-only, no outcome term).
  Turn 0 rewards (0.3, 0, 0): mean 0.1 -> 0.2, -0.1, -0.1.
  Turn 1 (only sessions 2, 3): (1, 0) -> +0.5, -0.5.
  normalise_then_sum, turn 0: 0.2, -0.1 + 0.5 = 0.4, -0.1 - 0.5 = -0.6.
  sum_then_normalise, turn 0: to go (0.3, 1, 0), mean 0.4333 -> -0.1333, 0.5667, -0.4333.
  normalise_then_sum + pad_finished: turn 1 counts session 1 as 0, (0, 1, 0),
  mean 1/3 -> -1/3, 2/3, -1/3, and session 1's sum runs over its padded
  turn 1 too: turn 0 = 0.2 - 1/3, -0.1 + 2/3, -0.1 - 1/3 = -0.1333, 0.5667,
  -0.4333: mean-only, the padded sum equals sum_then_normalise (the
  stopper is no longer credited +0.2 for leaving early).
  Break checked: leaving the padded terms out of the sum (padding the
  statistics only) gives session 1 +0.2 and fails.
  """
  mask = np.array([[0, 1, 0, 0], [0, 1, 0, 1], [0, 1, 0, 1]], np.float32)
  turn = np.array([[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]], np.int32)
  rew = np.array([[0, 0.3, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]], np.float32)
  batch = make_credit_batch(rew, mask, turn, group_id_b=np.zeros(3, np.int32))
  kw = dict(turn_signal="reward", outcome_weight=0.0, scale_by_std=False)
  adv, _ = run("mt_grpo", batch, turn_credit="normalise_then_sum", **kw)
  np.testing.assert_allclose(np.asarray(adv)[:, 1], [0.2, 0.4, -0.6], atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv)[1:, 3], [0.5, -0.5], atol=1e-6)
  adv, _ = run("mt_grpo", batch, turn_credit="sum_then_normalise", **kw)
  np.testing.assert_allclose(np.asarray(adv)[:, 1], [-0.4 / 3, 1.7 / 3, -1.3 / 3], atol=1e-6)
  adv, _ = run("mt_grpo", batch, turn_credit="normalise_then_sum", pad_finished=True, **kw)
  np.testing.assert_allclose(np.asarray(adv)[:, 1], [-0.4 / 3, 1.7 / 3, -1.3 / 3], atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv)[1:, 3], [2 / 3, -1 / 3], atol=1e-6)


def test_without_turn_rewards_mt_grpo_is_grpo():
  """No turn reward in the batch: the turn term is 0 and mt_grpo is grpo."""
  d = random_sessions(5, n_groups=2)
  d["turn_reward_bt"] = None
  batch = to_batch(d)
  np.testing.assert_allclose(np.asarray(run("mt_grpo", batch)[0]), np.asarray(run("grpo", batch)[0]),
                             rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ numpy oracle
def _norm(x, eps, scale, ddof):
  x = np.asarray(x, np.float64)
  dev = x - x.mean()
  if scale:
    sd = math.sqrt((dev ** 2).sum() / max(x.size - ddof, 1)) + eps
    dev = dev / sd if sd > 0 else 0.0 * dev
  return dev


def _turns(d, i, field):
  m = d["loss_mask_bt"][i] > 0
  out = {}
  for k in sorted(set(d["turn_idx_bt"][i][m].tolist())):
    toks = m & (d["turn_idx_bt"][i] == k)
    out[k] = float(d[field][i][toks].sum())
  return out


def _mt_oracle(d, turn_credit="own", turn_signal="turn_reward", pad_finished=False, turn_weight=1.0,
               outcome_weight=1.0, eps=1e-6, scale=True, ddof=0):
  b = d["reward_bt"].shape[0]
  valid = [i for i in range(b) if d["loss_mask_bt"][i].sum() > 0]
  grp = d["group_id_b"]
  field = "reward_bt" if turn_signal == "reward" else "turn_reward_bt"
  u = {i: _turns(d, i, field) for i in valid}
  a_o, a_t = {}, {}
  for g in set(grp[valid].tolist()):
    members = [i for i in valid if grp[i] == g]
    for i, a in zip(members, _norm([d["return_b"][i] for i in members], eps, scale, ddof)):
      a_o[i] = a
    longest = max(max(u[i]) + 1 for i in members)
    x = {}
    for i in members:
      for k in range(longest):
        if k in u[i]:
          x[i, k] = sum(v for j, v in u[i].items() if j >= k) if turn_credit == "sum_then_normalise" else u[i][k]
        elif pad_finished:
          x[i, k] = 0.0
    normed = {}
    for k in range(longest):
      who = [i for i in members if (i, k) in x]
      for i, a in zip(who, _norm([x[i, k] for i in who], eps, scale, ddof)):
        normed[i, k] = a
    for i in members:
      for k in u[i]:
        if turn_credit == "normalise_then_sum":
          a_t[i, k] = sum(v for (j, kk), v in normed.items() if j == i and kk >= k)
        else:
          a_t[i, k] = normed[i, k]
  adv = np.zeros(d["reward_bt"].shape)
  for i in valid:
    for k in u[i]:
      toks = (d["loss_mask_bt"][i] > 0) & (d["turn_idx_bt"][i] == k)
      adv[i, toks] = outcome_weight * a_o[i] + turn_weight * a_t[i, k]
  return adv


# (turn_credit, turn_signal, pad_finished, scale, ddof): every value of every option, and
# every turn_credit x pad_finished pair, in 9 static combinations (each compiles once).
MT_STATIC = st.sampled_from([
    ("own", "turn_reward", False, True, 0), ("own", "reward", True, False, 1),
    ("own", "turn_reward", True, True, 1), ("normalise_then_sum", "turn_reward", False, True, 1),
    ("normalise_then_sum", "reward", True, True, 0), ("normalise_then_sum", "reward", False, False, 0),
    ("sum_then_normalise", "turn_reward", True, True, 0), ("sum_then_normalise", "reward", False, True, 1),
    ("sum_then_normalise", "reward", True, False, 0)])
MT_FLOATS = st.fixed_dictionaries({"turn_weight": st.sampled_from([1.0, 0.7]),
                                   "outcome_weight": st.sampled_from([1.0, 0.0, 2.0]),
                                   "eps": st.sampled_from([1e-6, 0.0, 0.5])})


@settings(max_examples=30, deadline=None)
@given(seed=seeds, static=MT_STATIC, floats=MT_FLOATS)
def test_mt_grpo_matches_numpy(seed, static, floats):
  """Break checked: pad_finished padding only up to the session's own length
  (i.e. doing nothing) fails the pad_finished examples."""
  credit, signal, pad, scale, ddof = static
  d = random_sessions(seed, n_groups=2, pad_row=seed % 3 == 0)
  adv, tgt = run_traced("mt_grpo", to_batch(d), floats, turn_credit=credit, turn_signal=signal,
                        pad_finished=pad, scale_by_std=scale, ddof=ddof)
  expect = _mt_oracle(d, turn_credit=credit, turn_signal=signal, pad_finished=pad, scale=scale, ddof=ddof,
                      **floats)
  np.testing.assert_allclose(np.asarray(adv), expect, rtol=1e-4, atol=1e-5)
  assert tgt is None


@settings(max_examples=15, deadline=None)
@given(seed=seeds, credit=st.sampled_from(["own", "normalise_then_sum", "sum_then_normalise"]))
def test_mt_grpo_per_turn_layout_equals_session_layout(seed, credit):
  """Break checked: the turn reward read from every row of a turn's episode
  (instead of only the row holding the turn) doubles it in the per-turn layout."""
  d = random_sessions(seed, n_groups=2)
  per_turn, origin = split_per_turn(d, seed, pad_rows_to=72)
  whole, _ = run("mt_grpo", to_batch(d), turn_credit=credit, pad_finished=True)
  split, _ = run("mt_grpo", to_batch(per_turn), turn_credit=credit, pad_finished=True)
  whole, split = np.asarray(whole), np.asarray(split)
  for j, o in enumerate(origin):
    if o is None:
      assert np.all(split[j] == 0.0)
      continue
    m = per_turn["loss_mask_bt"][j] > 0
    np.testing.assert_allclose(split[j][m], whole[o[0]][m], rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, value=st.sampled_from([0.95, 0.1, -0.3, 1 / 3, 7.7e5]),
       credit=st.sampled_from(["own", "normalise_then_sum", "sum_then_normalise"]))
def test_mt_grpo_constant_groups_give_exactly_zero(seed, value, credit):
  """Sessions of a group with equal returns and equal turn rewards at every
  turn index (equal lengths): exactly 0 advantage, however the turns are
  combined. Break checked: a turn term normalised with plain
  (x - mean) / (std + eps) gives ~1e-1 at 0.95."""
  rng = np.random.default_rng(seed)
  b, t = 12, 10
  mask = np.zeros((b, t), np.float32)
  turn = np.zeros((b, t), np.int32)
  u = np.zeros((b, t), np.float32)
  group = np.repeat([0, 1], [7, 5])  # sums of 7 or 5 equal float32 values are rarely exact
  for i in range(b):
    pos = int(rng.integers(0, 2))
    for k in range(3):
      act = int(rng.integers(1, 3))
      turn[i, pos:pos + 1 + act] = k
      mask[i, pos + 1:pos + 1 + act] = 1
      u[i, pos + act] = value * (k + 1 + group[i])
      pos += 1 + act
    turn[i, pos:] = 2
  batch = make_credit_batch(np.zeros((b, t)), mask, turn, group_id_b=group, turn_reward_bt=u,
                            return_b=np.where(group == 0, value, -value).astype(np.float32))
  adv, _ = run("mt_grpo", batch, turn_credit=credit)
  assert np.all(np.asarray(adv) == 0.0)


def test_mt_grpo_rejects_bad_options():
  with pytest.raises(ValueError, match="turn_credit"):
    run("mt_grpo", _hand_batch(), turn_credit="both")
  with pytest.raises(ValueError, match="turn_signal"):
    run("mt_grpo", _hand_batch(), turn_signal="outcome")


# ------------------------------------------------------------------ progress
def test_progress_hand_example():
  """Shares (0.3, 0.7), (0.1, -0.1), (0.5, 0.5), gamma 1, group_turn, mean-only:
  G' = (1.0, 0.7), (0.0, -0.1), (1.0, 0.5); turn 0: mean 2/3 -> 1/3, -2/3, 1/3;
  turn 1: mean 0.3667 -> 0.3333, -0.4667, 0.1333. Env rewards are ignored.
  Break checked: adding the env rewards to the shares fails (the first
  session's turn 1 would be 1.7 - ...)."""
  share = np.array([[0, 0.3, 0, 0.7], [0, 0.1, 0, -0.1], [0, 0.5, 0, 0.5]], np.float32)
  batch = _hand_batch()._replace(progress_bt=np.asarray(share))
  adv, tgt = run("progress", batch, scale_by_std=False)
  np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]],
                             [[1 / 3, 1 / 3], [-2 / 3, -0.4667], [1 / 3, 0.1333]], atol=1e-4)
  assert tgt is None
  # gamma 0 with no normalisation: the share itself.
  adv, _ = run("progress", batch, gamma=0.0, norm="none")
  np.testing.assert_allclose(np.asarray(adv), share, atol=1e-7)
  # grounding: + 0.5 x the turn reward before anything else.
  adv, _ = run("progress", batch, gamma=0.0, norm="none", grounding_coef=0.5)
  np.testing.assert_allclose(np.asarray(adv), share + 0.5 * _TURN_REWARD, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(seed=seeds, gamma=st.sampled_from([0.0, 0.5, 1.0]), norm=st.sampled_from(["group_turn", "none", "group"]),
       ground=st.sampled_from([0.0, 0.3]))
def test_progress_is_return_to_go_over_the_shaped_rewards(seed, gamma, norm, ground):
  """progress == return_to_go on a batch whose rewards are the shares (+ the
  grounding term), checked against a plain numpy return-to-go for norm none.
  Break checked: the shares discounted with gamma applied forwards fails."""
  d = random_sessions(seed, n_groups=2, pad_row=seed % 2 == 0)
  batch = to_batch(d)
  adv, _ = run_traced("progress", batch, {"gamma": gamma, "grounding_coef": ground}, norm=norm)
  shaped = d["progress_bt"] + ground * d["turn_reward_bt"]
  ref, _ = run_traced("return_to_go", batch._replace(reward_bt=np.asarray(shaped, np.float32)),
                      {"gamma": gamma}, norm=norm)
  np.testing.assert_allclose(np.asarray(adv), np.asarray(ref), rtol=1e-5, atol=1e-6)
  if norm == "none":
    expect = np.zeros(shaped.shape)
    for i in range(shaped.shape[0]):
      m = d["loss_mask_bt"][i] > 0
      ks = sorted(set(d["turn_idx_bt"][i][m].tolist()))
      r = {k: shaped[i][m & (d["turn_idx_bt"][i] == k)].sum() for k in ks}
      for k in ks:
        expect[i, m & (d["turn_idx_bt"][i] == k)] = sum(gamma ** (j - k) * r[j] for j in ks if j >= k)
    np.testing.assert_allclose(np.asarray(adv), expect, rtol=1e-5, atol=1e-5)


def test_progress_without_shares_is_an_error_naming_the_field():
  with pytest.raises(ValueError, match="progress_bt"):
    compute_advantages("progress", _hand_batch())
