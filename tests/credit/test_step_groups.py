"""gigpo and hgpo: hand-worked examples, a plain-numpy oracle on random groups
(both layouts), constant groups, and the fallback to the episode term.

The oracle (`_oracle`) is written from the papers' definitions with Python
dicts keyed on (group, state, earlier states), the way verl-agent builds its
step groups, and shares no code with credit/step_groups.py.
"""
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_fixtures import random_sessions, run, run_traced, seeds, split_per_turn, to_batch
from mtrl_jax.credit import make_credit_batch
from mtrl_jax.credit.step_groups import pair_rank, step_group_stats

# Three two-turn sessions of one group, one observation + one action token per turn:
#   position  0  1  2  3
#   mask      0  1  0  1
#   turn      0  0  1  1
_MASK = np.tile(np.array([0, 1, 0, 1], np.float32), (3, 1))
_TURN = np.tile(np.array([0, 0, 1, 1], np.int32), (3, 1))
_REW = np.array([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1]], np.float32)
_STATE = np.array([[7, 7, 3, 3], [7, 7, 3, 3], [7, 7, 9, 9]], np.int32)  # s0 = 7; s1 = 3; s2 = 9


def _hand_batch(state=_STATE):
  return make_credit_batch(_REW, _MASK, _TURN, group_id_b=np.array([5, 5, 5]), state_id_bt=state)


def test_gigpo_hand_example():
  """docs/credit.md's example. Break checked: the step return not discounted
  (gamma ignored: G = (1, 1), (0, 0), (1, 1)) gives turn 0 +1/3, -2/3, +1/3
  and fails; so does normalising the step term over the whole task group
  instead of the anchor state's group (the third session's turn 1 would get
  +1/3 instead of 0)."""
  adv, tgt = run("gigpo", _hand_batch(), gamma=0.5)
  expect = np.array([[0.5, 5 / 6], [-1.0, -7 / 6], [0.5, 1 / 3]])
  np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]], expect, rtol=1e-5)
  assert np.all(np.asarray(adv)[:, [0, 2]] == 0.0)
  assert tgt is None
  counts = {k: int(v) for k, v in step_group_stats(_hand_batch()).items()}
  assert counts == {"turns": 6, "keyed": 6, "grouped": 5}


def test_gigpo_with_std_and_weight():
  """scale_by_std divides each group by its std; step_weight scales only the
  step term. Turn 0: A^E = (R - 2/3) / sqrt(2/9) = 0.7071, -1.4142, 0.7071;
  A^S = (G - 1/3) / sqrt(1/18) = 0.7071, -1.4142, 0.7071. Turn 1 (s1 pair):
  A^S = +-1. Break checked: step_weight applied to the episode term instead
  fails (turn 0 would be 0.7071 * 2 * ... differently weighted)."""
  adv, _ = run("gigpo", _hand_batch(), gamma=0.5, scale_by_std=True, eps=0.0, step_weight=2.0)
  r = 1 / math.sqrt(2)
  expect = np.array([[r + 2 * r, r + 2], [-2 * r - 4 * r, -2 * r - 2], [r + 2 * r, r]])
  np.testing.assert_allclose(np.asarray(adv)[:, [1, 3]], expect, rtol=1e-5)


def test_hgpo_hand_example():
  """docs/credit.md's hgpo example: three 3-turn sessions, all at state s on
  turn 2 with earlier states (a, b), (a, c), (a, b); G at turn 2 = 1, 0, 0.4
  (rewards only there). depth 1, alpha 1, no episode term. Level 0 (all
  three): 0.5333, -0.4667, -0.0667. Level 1 (previous state b: sessions 1
  and 3): +0.3, -0.3. A = (1 x 0.5333 + 2 x 0.3) / 3 = 0.3778, -0.4667,
  (1 x -0.0667 + 2 x -0.3) / 3 = -0.2222. Break checked: equal level weights
  (alpha ignored) give 0.4167 and -0.1833 and fail; reading the history
  from the following turn instead of the previous one fails too."""
  mask = np.tile(np.array([0, 1] * 3, np.float32), (3, 1))
  turn = np.tile(np.repeat(np.arange(3), 2).astype(np.int32), (3, 1))
  rew = np.zeros((3, 6), np.float32)
  rew[:, 5] = [1.0, 0.0, 0.4]
  a, b, c, s = 1, 2, 3, 4
  state = np.array([np.repeat([a, b, s], 2), np.repeat([a, c, s], 2), np.repeat([a, b, s], 2)], np.int32)
  batch = make_credit_batch(rew, mask, turn, group_id_b=np.zeros(3, np.int32), state_id_bt=state)
  adv, _ = run("hgpo", batch, depth=1, alpha=1.0, gamma=1.0, episode_weight=0.0)
  np.testing.assert_allclose(np.asarray(adv)[:, 5], [0.37778, -0.46667, -0.22222], rtol=1e-4)
  # Turn 1: level 0 groups (b: sessions 1, 3; c alone); level 1 needs the turn-0 state a:
  # sessions 1 and 3 share (b, a). G at turn 1 = 1, 0, 0.4 too -> +0.3, -, -0.3 at both levels.
  np.testing.assert_allclose(np.asarray(adv)[:, 3], [0.3, 0.0, -0.3], rtol=1e-4, atol=1e-6)


def test_no_state_ids_falls_back_to_the_episode_term():
  """Without any state key every turn falls back to the episode term: gigpo
  and hgpo equal grpo (with the same normalisation), and no turn is grouped.
  Break checked: giving unkeyed turns state -1 as a real key (one group of
  all unkeyed turns) fails here."""
  d = random_sessions(11, n_groups=2)
  d["state_id_bt"] = np.full_like(d["state_id_bt"], -1)
  batch = to_batch(d)
  ref, _ = run("grpo", batch, scale_by_std=False)
  for name in ("gigpo", "hgpo"):
    adv, _ = run(name, batch)
    np.testing.assert_allclose(np.asarray(adv), np.asarray(ref), rtol=1e-6, atol=1e-7, err_msg=name)
  assert int(step_group_stats(batch)["grouped"]) == 0
  none, _ = run("gigpo", batch._replace(state_id_bt=None))
  np.testing.assert_allclose(np.asarray(none), np.asarray(ref), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ numpy oracle
def _norm(x, eps, scale, ddof):
  x = np.asarray(x, np.float64)
  dev = x - x.mean()
  if scale:
    sd = math.sqrt((dev ** 2).sum() / max(x.size - ddof, 1)) + eps
    dev = dev / sd if sd > 0 else 0.0 * dev
  return dev


def _turns(d, i):
  """{turn: (reward, state or None)} of session row i."""
  m = d["loss_mask_bt"][i] > 0
  out = {}
  for k in sorted(set(d["turn_idx_bt"][i][m].tolist())):
    toks = np.flatnonzero(m & (d["turn_idx_bt"][i] == k))
    s = int(d["state_id_bt"][i][toks[0]])
    out[k] = (float(d["reward_bt"][i][toks].sum()), s if s >= 0 else None)
  return out


def _oracle(d, name, gamma=0.95, step_weight=1.0, eps=1e-6, scale=False, ddof=0, depth=2, alpha=1.0,
            episode_weight=1.0):
  """Per-token advantages of gigpo / hgpo on session-layout arrays."""
  b = d["reward_bt"].shape[0]
  valid = [i for i in range(b) if d["loss_mask_bt"][i].sum() > 0]
  grp = d["group_id_b"]
  a_ep = {}
  for g in set(grp[valid].tolist()):
    members = [i for i in valid if grp[i] == g]
    for i, a in zip(members, _norm([d["return_b"][i] for i in members], eps, scale, ddof)):
      a_ep[i] = a
  turns = {i: _turns(d, i) for i in valid}
  ret = {}
  for i in valid:
    for k in turns[i]:
      ret[i, k] = sum(gamma ** (j - k) * r for j, (r, _) in turns[i].items() if j >= k)
  levels = range(depth + 1) if name == "hgpo" else range(1)
  groups = {}
  for i in valid:
    for k, (_, s) in turns[i].items():
      key = [grp[i], s]
      for l in levels:
        if l > 0:
          prev = turns[i].get(k - l)
          key = key + [None if prev is None else prev[1]]
        if any(x is None for x in key):
          break
        groups.setdefault((l, tuple(key)), []).append((i, k))
  per_level = {}
  for (l, _), members in groups.items():
    if len(members) < 2:
      continue
    for m, a in zip(members, _norm([ret[x] for x in members], eps, scale, ddof)):
      per_level.setdefault(m, []).append((l, a))
  adv = np.zeros(d["reward_bt"].shape)
  for i in valid:
    for k in turns[i]:
      parts = per_level.get((i, k), [])
      w = [(l + 1) ** alpha for l, _ in parts]
      step = sum(wi * a for wi, (_, a) in zip(w, parts)) / sum(w) if parts else 0.0
      ep_w = episode_weight if name == "hgpo" else 1.0
      toks = (d["loss_mask_bt"][i] > 0) & (d["turn_idx_bt"][i] == k)
      adv[i, toks] = ep_w * a_ep[i] + step_weight * step
  return adv


# Static options (each combination compiles once) and float ones (traced: no recompiles).
STATIC = st.sampled_from([dict(), dict(scale=True), dict(scale=True, ddof=1)])
FLOATS = st.fixed_dictionaries({"gamma": st.sampled_from([0.95, 0.5, 1.0, 0.0]),
                                "step_weight": st.sampled_from([1.0, 0.3]),
                                "eps": st.sampled_from([1e-6, 0.0, 0.5])})
HGPO_STATIC = st.sampled_from([(0, dict()), (1, dict(scale=True, ddof=1)), (3, dict(scale=True)),
                               (2, dict())])  # (depth, static options): 4 compiles
HGPO_FLOATS = st.fixed_dictionaries({"alpha": st.sampled_from([1.0, 2.0, 0.0]),
                                     "episode_weight": st.sampled_from([1.0, 0.0])})


def _static(opts):
  return {("scale_by_std" if k == "scale" else k): v for k, v in opts.items()}


@settings(max_examples=20, deadline=None)
@given(seed=seeds, opts=STATIC, floats=FLOATS)
def test_gigpo_matches_numpy(seed, opts, floats):
  """Break checked: a step group keyed on the state alone (not also the task
  group) fails as soon as two groups share a state id (ids come from {3, 40,
  41}); so does reading a turn's state id at its row's first token instead
  of the turn's first action token."""
  d = random_sessions(seed, n_groups=2, pad_row=seed % 3 == 0)
  adv, tgt = run_traced("gigpo", to_batch(d), floats, **_static(opts))
  np.testing.assert_allclose(np.asarray(adv), _oracle(d, "gigpo", **opts, **floats), rtol=1e-4, atol=1e-5)
  assert tgt is None


@settings(max_examples=20, deadline=None)
@given(seed=seeds, static=HGPO_STATIC, floats=FLOATS, hfloats=HGPO_FLOATS)
def test_hgpo_matches_numpy(seed, static, floats, hfloats):
  """Break checked: the history read one turn too far back (state of turn
  k - l - 1) fails here."""
  depth, opts = static
  d = random_sessions(seed, n_groups=2, pad_row=seed % 3 == 1)
  adv, _ = run_traced("hgpo", to_batch(d), {**floats, **hfloats}, depth=depth, **_static(opts))
  np.testing.assert_allclose(np.asarray(adv), _oracle(d, "hgpo", depth=depth, **opts, **floats, **hfloats),
                             rtol=1e-4, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(seed=seeds)
def test_step_groups_per_turn_layout_equals_session_layout(seed):
  """One row per turn (shuffled, padded) gives every turn the advantage it
  gets in its session row. Break checked: the turn table keyed on rows
  instead of episodes (each turn row its own episode, so a turn's
  discounted return misses the turns in other rows) fails here and
  nowhere in the session layout."""
  d = random_sessions(seed, n_groups=2)
  per_turn, origin = split_per_turn(d, seed, pad_rows_to=72)
  for name in ("gigpo", "hgpo"):
    whole, _ = run(name, to_batch(d))
    split, _ = run(name, to_batch(per_turn))
    whole, split = np.asarray(whole), np.asarray(split)
    for j, o in enumerate(origin):
      if o is None:
        assert np.all(split[j] == 0.0)
        continue
      m = per_turn["loss_mask_bt"][j] > 0
      np.testing.assert_allclose(split[j][m], whole[o[0]][m], rtol=1e-5, atol=1e-6, err_msg=name)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, value=st.sampled_from([0.95, 0.1, -0.3, 1 / 3, 7.7e5]),
       scale=st.booleans(), gamma=st.sampled_from([0.95, 1.0, 0.3]))
def test_constant_groups_give_exactly_zero(seed, value, scale, gamma):
  """Sessions of a group with the same per-turn rewards (ragged token layouts,
  float32 values like 0.95) and state ids that name the turn: every episode
  and step group is constant, so every advantage is exactly 0. Break
  checked: the step term normalised with a plain (x - mean) / (std + eps)
  (no per-segment shift, as segment_normalize does) gives ~1e-1 here."""
  rng = np.random.default_rng(seed)
  b, t, n_turns = 12, 12, 3
  mask = np.zeros((b, t), np.float32)
  turn = np.zeros((b, t), np.int32)
  rew = np.zeros((b, t), np.float32)
  state = np.full((b, t), -1, np.int32)
  group = np.repeat([0, 1], [7, 5])  # sums of 7 or 5 equal float32 values are rarely exact
  for i in range(b):
    pos = int(rng.integers(0, 2))
    for k in range(n_turns):
      act = int(rng.integers(1, 3))
      turn[i, pos:pos + 1 + act] = k
      mask[i, pos + 1:pos + 1 + act] = 1
      rew[i, pos + act] = value * (group[i] + 1) if k != 1 else -value
      state[i, pos:pos + 1 + act] = 100 + k if rng.random() < 0.8 else -1
      pos += 1 + act
    turn[i, pos:] = n_turns - 1
  batch = make_credit_batch(rew, mask, turn, group_id_b=group, state_id_bt=state)
  for name, hp in (("gigpo", {}), ("hgpo", {"depth": 2})):
    adv, _ = run_traced(name, batch, {"gamma": gamma}, scale_by_std=scale, **hp)
    assert np.all(np.asarray(adv) == 0.0), name


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_step_group_stats_match_numpy(seed):
  """Counts of turns, keyed turns and turns sharing (group, state) with another."""
  d = random_sessions(seed, n_groups=2, pad_row=True)
  got = {k: int(v) for k, v in step_group_stats(to_batch(d)).items()}
  valid = [i for i in range(d["reward_bt"].shape[0]) if d["loss_mask_bt"][i].sum() > 0]
  keys = [(d["group_id_b"][i], s) for i in valid for _, s in _turns(d, i).values()]
  keyed = [k for k in keys if k[1] is not None]
  grouped = sum(keyed.count(k) > 1 for k in keyed)
  assert got == {"turns": len(keys), "keyed": len(keyed), "grouped": grouped}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=30))
def test_pair_rank_is_dense_and_exact(pairs):
  """Equal pairs share a rank, different pairs differ, ranks are 0..n-1 in
  lexicographic order, for any int32 values (no overflow from packing)."""
  # Padded to one shape (one compile) with pairs that sort after every real one.
  n = len(pairs)
  a = np.array([p[0] for p in pairs] + [4] * (32 - n), np.int32)
  b = np.array([p[1] for p in pairs] + list(range(32 - n)), np.int32)
  r = np.asarray(_pair_rank(a, b))[:n]
  uniq = sorted(set(pairs))
  assert r.tolist() == [uniq.index(p) for p in pairs]


_pair_rank = jax.jit(pair_rank)


def test_rejects_bad_hparams():
  batch = _hand_batch()
  with pytest.raises(ValueError, match="ddof"):
    run("gigpo", batch, ddof=2)
  with pytest.raises(ValueError, match="gamma"):
    run("gigpo", batch, gamma=1.5)
  with pytest.raises(ValueError, match="depth"):
    run("hgpo", batch, depth=-1)
