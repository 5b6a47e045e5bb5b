"""grpo, tree, rloo and return_to_go against plain numpy references on random
sessions (ragged turns, padding rows, sparse ids), for every normalisation
option; return_to_go also in the per-turn layout.

Break checked to fail here (the mutant, run with jit off against this file):
discounted_turn_returns scanning forwards (`reverse=False`) fails
test_return_to_go_matches_numpy. Meant to catch as well (not run one by
one): tree adding the group term twice; rloo dividing by cnt instead of
cnt - 1, or giving a lone session an advantage; return_to_go with wrong
segment ids for a norm; eps / ddof / scale_by_std not passed through.
"""
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from credit_fixtures import random_sessions, run, run_traced, seeds, split_per_turn, to_batch
from mtrl_jax.credit import compute_advantages, make_credit_batch


def _norm(x, seg, valid, eps, scale, ddof):
  out = np.zeros(len(x))
  for s in np.unique(seg[valid]):
    idx = np.flatnonzero(valid & (seg == s))
    # A segment whose values differ by less than float32 can hold is constant to the float32
    # estimators (advantage exactly 0) but not to this float64 reference, which would scale
    # the rounding-level spread up to +-0.7 (seen: gamma 8e-14 made two returns -1 and
    # -1 - 8e-14). Such examples test rounding, not the estimator: draw another.
    spread = np.ptp(x[idx]) if idx.size else 0.0
    assume(not 0.0 < spread <= 1e-5 * max(float(np.abs(x[idx]).max()), 1e-30))
    dev = x[idx] - x[idx].mean()
    if scale:
      sd = np.sqrt((dev ** 2).sum() / max(idx.size - ddof, 1)) + eps
      dev = dev / sd if sd > 0 else 0.0 * dev
    out[idx] = dev
  return out


def _spread(adv_b, mask):
  return np.where(mask > 0, adv_b[:, None], 0.0)


def _outcome_ref(name, d, eps=1e-6, scale=True, ddof=0):
  ret = d["return_b"].astype(np.float64)
  valid = d["loss_mask_bt"].sum(1) > 0
  grp = d["group_id_b"]
  if name == "rloo":
    adv = np.zeros(len(ret))
    for i in np.flatnonzero(valid):
      same = np.flatnonzero(valid & (grp == grp[i]))
      if same.size > 1:
        adv[i] = ret[i] - (ret[same].sum() - ret[i]) / (same.size - 1)
    return _spread(adv, d["loss_mask_bt"])
  adv = _norm(ret, grp, valid, eps, scale, ddof)
  if name == "tree":
    adv = adv + _norm(ret, d["tree_id_b"], valid, eps, scale, ddof)
  return _spread(adv, d["loss_mask_bt"])


OPTIONS = st.sampled_from([dict(), dict(eps=0.5), dict(ddof=1), dict(scale_by_std=False),
                           dict(eps=0.0, ddof=1)])


@settings(max_examples=25, deadline=None)
@given(seed=seeds, opts=OPTIONS)
def test_outcome_estimators_match_numpy(seed, opts):
  d = random_sessions(seed, n_groups=2, pad_row=seed % 3 == 0)
  d["return_b"] = d["return_b"] + np.random.default_rng(seed).normal(size=6).astype(np.float32)
  batch = to_batch(d)
  ref_kw = dict(eps=opts.get("eps", 1e-6), scale=opts.get("scale_by_std", True),
                ddof=opts.get("ddof", 0))
  for name in ("grpo", "ms_grpo", "tree"):
    adv, tgt = run(name, batch, **opts)
    expect = _outcome_ref("grpo" if name == "ms_grpo" else name, d, **ref_kw)
    np.testing.assert_allclose(np.asarray(adv), expect, rtol=1e-4, atol=1e-5, err_msg=name)
    assert tgt is None
  adv, tgt = run("rloo", batch)
  np.testing.assert_allclose(np.asarray(adv), _outcome_ref("rloo", d), rtol=1e-4, atol=1e-5)
  assert tgt is None


def _rtg_ref(d, gamma, norm, k, eps=1e-6, scale=True, ddof=0):
  mask, turn, rew = d["loss_mask_bt"] > 0, d["turn_idx_bt"], d["reward_bt"]
  b = mask.shape[0]
  counted = mask & (turn >= 0) & (turn < k)
  r = np.zeros((b, k))
  exists = np.zeros((b, k), bool)
  for i, j in zip(*np.nonzero(counted)):
    r[i, turn[i, j]] += rew[i, j]
    exists[i, turn[i, j]] = True
  g = np.zeros((b, k))
  nxt = np.zeros(b)
  for kk in reversed(range(k)):
    nxt = r[:, kk] + gamma * nxt
    g[:, kk] = nxt
  valid = exists & (mask.sum(1) > 0)[:, None]
  grp = np.broadcast_to(d["group_id_b"][:, None], (b, k))
  kidx = np.broadcast_to(np.arange(k)[None, :], (b, k))
  if norm == "none":
    a = np.where(valid, g, 0.0)
  else:
    seg = {"group_turn": grp * 1000 + kidx, "group": grp, "global": 0 * grp}[norm]
    a = _norm(g.reshape(-1), seg.reshape(-1), valid.reshape(-1), eps, scale,
              ddof).reshape(b, k)
  out = np.zeros(mask.shape)
  out[counted] = a[np.nonzero(counted)[0], turn[counted]]
  return out


@settings(max_examples=25, deadline=None)
@example(seed=600, gamma=8.284583278726429e-14, norm="group", opts={"eps": 0.0, "ddof": 1})  # rejected: rounding
@given(seed=seeds, gamma=st.floats(0.0, 1.0, width=32),
       norm=st.sampled_from(["group_turn", "group", "global", "none"]), opts=OPTIONS)
def test_return_to_go_matches_numpy(seed, gamma, norm, opts):
  d = random_sessions(seed, n_groups=2, pad_row=seed % 3 == 0)
  ref_kw = dict(eps=opts.get("eps", 1e-6), scale=opts.get("scale_by_std", True),
                ddof=opts.get("ddof", 0))
  adv, tgt = run_traced("return_to_go", to_batch(d), {"gamma": gamma}, norm=norm, **opts)
  expect = _rtg_ref(d, gamma, norm, d["reward_bt"].shape[1], **ref_kw)
  np.testing.assert_allclose(np.asarray(adv), expect, rtol=1e-4, atol=1e-4)
  assert tgt is None
  # max_turns=2: turns >= 2 are dropped from the bookkeeping (advantage 0).
  adv2, _ = run_traced("return_to_go", to_batch(d), {"gamma": gamma}, norm=norm,
                       max_turns=2, **opts)
  np.testing.assert_allclose(np.asarray(adv2), _rtg_ref(d, gamma, norm, 2, **ref_kw),
                             rtol=1e-4, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(seed=seeds, norm=st.sampled_from(["group_turn", "group", "none"]))
def test_return_to_go_per_turn_layout_equals_session_layout(seed, norm):
  """Each turn-row gets the advantage its turn had in the whole session."""
  d = random_sessions(seed, n_groups=2)
  per_turn, origin = split_per_turn(d, seed, pad_rows_to=72)
  adv_s = np.asarray(run_traced("return_to_go", to_batch(d), {"gamma": 0.7}, norm=norm)[0])
  adv_p = np.asarray(run_traced("return_to_go", to_batch(per_turn), {"gamma": 0.7},
                                norm=norm)[0])
  for j, o in enumerate(origin):
    m = per_turn["loss_mask_bt"][j] > 0
    if o is None:
      assert np.all(adv_p[j] == 0.0)
      continue
    np.testing.assert_allclose(adv_p[j][m], adv_s[o[0]][m], rtol=1e-5, atol=1e-5)
    assert np.all(adv_p[j][~m] == 0.0)


def test_invalid_ddof_is_rejected_with_its_value():
  """The message names the parameter and the bad value (whole first line)."""
  b = make_credit_batch(np.zeros((2, 2)), np.ones((2, 2)), return_b=np.array([1.0, 0.0]))
  for name in ("grpo", "ms_grpo", "tree", "return_to_go"):
    with pytest.raises(ValueError) as err:
      compute_advantages(name, b, ddof=2)
    assert str(err.value).splitlines()[0] == "ddof must be 0 or 1, got 2", name
