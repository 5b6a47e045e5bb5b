"""A group whose sessions all score the same carries no signal: every
group-normalised estimator must give it exactly 0 advantage, whatever the
float32 value, the group size, the padding and the token layout.

Before the fix (segments.segment_normalize shifting each segment by its
minimum), the float32 mean of e.g. eight 0.95s was one rounding step off and
(R - mean) / (std + eps) turned that step into a sizeable advantage (+0.056
in the issue's example). Every test here fails on that code (checked with
`git show ad59dc3~1:mtrl_jax/credit/segments.py`).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from credit_fixtures import jitted, run_traced, split_per_turn, to_batch
from mtrl_jax.credit import (PolicyLossConfig, compute_advantages, make_credit_batch,
                             policy_loss)
from mtrl_jax.credit.segments import segment_normalize

B_S, B_P, T = 10, 28, 10  # session rows, per-turn rows, tokens (fixed: one compile)
MAX_TURNS = 3

# Float32 values, with a few that float32 cannot hold exactly listed first so
# they are always tried.
_SPECIAL = [0.95, 0.1, -0.3, 1 / 3, 1e-3, 7.7e5]
ANY_F32 = st.one_of(st.sampled_from(_SPECIAL),
                    st.floats(width=32, allow_nan=False, allow_infinity=False))
# Rewards summed over turns: bounded so that 3 turns cannot overflow.
REWARD_F32 = st.one_of(st.sampled_from(_SPECIAL),
                       st.floats(-2.0**100, 2.0**100, width=32))


def _row_layout(rng, n_turns):
  """Mask, turn index and each turn's last action token of one session row:
  an optional prompt token, then per turn 0-1 observation tokens (>= 1 after
  the first turn) and 1-2 action tokens; padding after the last turn."""
  mask = np.zeros(T, np.float32)
  turn = np.zeros(T, np.int32)
  last = []
  pos = int(rng.integers(0, 2))
  for k in range(n_turns):
    obs, act = int(rng.integers(0 if k == 0 else 1, 2)), int(rng.integers(1, 3))
    turn[pos:pos + obs + act] = k
    mask[pos + obs:pos + obs + act] = 1
    pos += obs + act
    last.append(pos - 1)
  turn[pos:] = n_turns - 1
  return mask, turn, last


def constant_group_batch(seed, group_sizes, values, turn_rewards=None, gamma_zero=False):
  """Session-layout arrays: group g has group_sizes[g] sessions of return
  values[g]. With `turn_rewards[g]` (one reward per turn), every session of
  group g has those turns (ragged token layouts) and return = their sum.
  With `gamma_zero`, every turn of group g pays values[g] instead. Rows past
  the sessions are padding (no action token) with a wild return that must
  not enter any statistic, in a random real group. Observation tokens carry
  garbage rewards (mask 0: ignored). Trees subdivide groups at random."""
  rng = np.random.default_rng(seed)
  reward = rng.normal(size=(B_S, T)).astype(np.float32) * 50  # garbage
  mask = np.zeros((B_S, T), np.float32)
  turn = np.zeros((B_S, T), np.int32)
  group = np.zeros(B_S, np.int64)
  tree = np.zeros(B_S, np.int64)
  ret = rng.normal(size=B_S).astype(np.float32) * 1e6  # padding rows keep these
  row = 0
  for g, (size, val) in enumerate(zip(group_sizes, values)):
    for _ in range(size):
      n_turns = int(rng.integers(1, MAX_TURNS + 1))
      if turn_rewards is not None:
        r_k = turn_rewards[g]
      else:
        r_k = [val if gamma_zero else 0.0] * n_turns
      m, k, last = _row_layout(rng, len(r_k))
      mask[row], turn[row] = m, k
      reward[row][m > 0] = 0.0
      reward[row, last] = r_k  # the turn's reward on its last action token
      ret[row] = val
      group[row] = 3 + 5 * g
      tree[row] = 100 * g + int(rng.integers(0, 2))
      row += 1
  for pad in range(row, B_S):
    group[pad] = 3 + 5 * int(rng.integers(0, len(group_sizes)))
    tree[pad] = 100 * int(rng.integers(0, len(group_sizes)))
    turn[pad] = rng.integers(0, MAX_TURNS, size=T)
  return dict(reward_bt=reward, loss_mask_bt=mask, turn_idx_bt=turn, group_id_b=group,
              episode_id_b=np.arange(B_S) * 7 + 1, tree_id_b=tree, return_b=ret,
              value_bt=np.zeros((B_S, T), np.float32))


def _per_turn(d, seed):
  return split_per_turn(d, seed, pad_rows_to=B_P)[0]


@functools.lru_cache(maxsize=None)
def _pg_grad_fn():
  cfg = PolicyLossConfig(agg="token_mean")
  return jax.jit(jax.grad(lambda lp, blp, adv, m: policy_loss(cfg, lp, blp, adv, m)[0]))


def _assert_zero_with_zero_pg_grad(adv, d, seed, what):
  adv = np.asarray(adv)
  assert np.all(adv == 0.0), (what, adv[adv != 0][:5])
  rng = np.random.default_rng(seed)
  logp = (rng.normal(size=adv.shape) - 2.0).astype(np.float32)
  behav = (logp + 0.3 * rng.normal(size=adv.shape)).astype(np.float32)
  grad = np.asarray(_pg_grad_fn()(logp, behav, adv, d["loss_mask_bt"]))
  assert np.all(grad == 0.0), (what, grad[grad != 0][:5])


# Up to 9 sessions in all (the per-turn layout then needs at most B_P rows).
# Groups of 6 or more matter: the float32 mean of n copies of 0.95, 0.1, 1/3
# is exact for n <= 5 or 6 and one rounding step off from n = 7 on.
group_sizes = st.lists(st.integers(1, 9), min_size=1, max_size=3).filter(
    lambda s: sum(s) <= 9)


def test_issue_example_eight_095_returns():
  """The issue's batch: one group, eight sessions of return 0.95 (not exact
  in float32). The pre-fix code gave every token +0.056."""
  b = make_credit_batch(np.zeros((8, 2)), np.ones((8, 2)),
                        return_b=np.full(8, 0.95, np.float32))
  adv = np.asarray(compute_advantages("grpo", b)[0])
  np.testing.assert_array_equal(adv, np.zeros((8, 2), np.float32))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sizes=group_sizes, data=st.data())
@example(seed=0, sizes=[7, 2], data=None)
def test_outcome_estimators_give_constant_groups_zero(seed, sizes, data):
  """grpo, ms_grpo (both std conventions, and without std) and tree give
  exactly 0 on every token, in the session and the per-turn layout, and a
  token-mean PPO loss built on them has zero gradient. Breaks caught: the
  pre-fix segment_normalize (no shift: +-0.06 and up on inexact values);
  padding rows entering the statistics (their returns are ~1e6)."""
  values = ([0.95, -0.3] if data is None
            else [data.draw(ANY_F32) for _ in sizes])
  d = constant_group_batch(seed, sizes, values)
  layouts = {"session": d, "per_turn": _per_turn(d, seed)}
  for layout, arrays in layouts.items():
    batch = to_batch(arrays)
    for name, hp in (("grpo", ()), ("grpo", (("ddof", 1),)),
                     ("grpo", (("scale_by_std", False),)), ("ms_grpo", ()),
                     ("tree", ())):
      adv, _ = jitted(name, hp)(batch)
      _assert_zero_with_zero_pg_grad(adv, arrays, seed, (layout, name, hp, values))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sizes=group_sizes,
       gamma=st.floats(0.0, 1.0, width=32), data=st.data())
@example(seed=1, sizes=[7, 2], gamma=0.0, data=None)
def test_return_to_go_group_turn_gives_identical_sessions_zero(seed, sizes, gamma, data):
  """return_to_go, norm 'group_turn': all sessions of a group have the same
  per-turn rewards (ragged token layouts), so each (group, turn) segment is
  constant. Exactly 0 in both layouts, zero PPO gradient. Breaks caught:
  the pre-fix segment_normalize."""
  if data is None:
    rewards = [[0.95, 0.1, -0.3], [1 / 3, 0.0]]
  else:
    rewards = [[data.draw(REWARD_F32) for _ in range(data.draw(st.integers(1, MAX_TURNS)))]
               for _ in sizes]
  d = constant_group_batch(seed, sizes, [sum(r) for r in rewards], turn_rewards=rewards)
  for layout, arrays in {"session": d, "per_turn": _per_turn(d, seed)}.items():
    adv, _ = run_traced("return_to_go", to_batch(arrays), {"gamma": gamma},
                        norm="group_turn")
    _assert_zero_with_zero_pg_grad(adv, arrays, seed, (layout, rewards, gamma))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sizes=group_sizes, data=st.data())
@example(seed=2, sizes=[7, 1, 1], data=None)
def test_return_to_go_group_and_global_give_constant_turns_zero(seed, sizes, data):
  """return_to_go with gamma 0 (G = the turn's own reward) where every turn of
  group g pays the same value: norm 'group' gives exactly 0, and norm
  'global' too when one value is shared by all groups. Both layouts, zero
  PPO gradient. Breaks caught: the pre-fix segment_normalize."""
  values = ([0.95, 0.1, 1 / 3] if data is None
            else [data.draw(REWARD_F32) for _ in sizes])
  d = constant_group_batch(seed, sizes, values, gamma_zero=True)
  shared = constant_group_batch(seed, sizes, [values[0]] * len(sizes), gamma_zero=True)
  cases = (("group", d), ("global", shared))
  for norm, sess in cases:
    for layout, arrays in {"session": sess, "per_turn": _per_turn(sess, seed)}.items():
      adv, _ = run_traced("return_to_go", to_batch(arrays), {"gamma": 0.0}, norm=norm)
      _assert_zero_with_zero_pg_grad(adv, arrays, seed, (norm, layout, values))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_segment_normalize_constant_segments_are_exactly_zero(seed, data):
  """segment_normalize itself: segments of equal valid values (any float32,
  any size, invalid entries holding other values, empty segments) give
  exactly 0 for eps 0 or not, ddof 0 or 1, with or without std scaling.
  Breaks caught: the pre-fix version (no shift by the segment minimum)."""
  rng = np.random.default_rng(seed)
  n, s = 24, int(rng.integers(1, 5))
  seg = rng.integers(0, s, size=n).astype(np.int32)
  valid = rng.random(n) < 0.7
  vals = np.array([data.draw(ANY_F32) for _ in range(s)], np.float32)
  x = np.where(valid, vals[seg], rng.normal(size=n) * 1e5).astype(np.float32)
  for eps, ddof, scale in ((1e-6, 0, True), (0.0, 1, True), (1e-6, 0, False)):
    out = np.asarray(segment_normalize(jnp.asarray(x), jnp.asarray(seg), jnp.asarray(valid), s,
                                       eps, scale, ddof))
    assert np.all(out == 0.0), (eps, ddof, scale, vals, out)
