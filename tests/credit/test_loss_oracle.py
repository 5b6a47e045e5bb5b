"""The policy and value losses against a float64 numpy reference (loss_oracle.py).

Every example carries the tokens where a slip shows: masked tokens holding
garbage (log-probs 80 / -1e4, advantages 1e6), a row without tokens,
advantages exactly 0 and in (0, 1), ratios exactly 1, behaviour weights
exactly 1 and above the cap, turn indices outside [0, max_turns), and
entropy ties. Each configuration below switches on a different set of
terms; the loss and every diagnostic are compared.

Found by mutation testing (docs/mutation.md): before these tests, edits of
ppo.py / losses.py / diagnostics.py that change only a diagnostic, a
masked-token fill or a term absent from the hand examples survived.
Breaks checked (each by hand in a scratch copy, with jit off): the
decoupled ratio divided by the behaviour log-probs (u = pi / pi_behav),
`adv > 0` -> `adv >= 0` in the clip-high flag, the masked-token fill of the
log-ratio 0.0 -> 1.0, `w <= behav_cap` -> `w < behav_cap`, the approx-KL
log floor 1e-30 -> 1.0, the KL term left out of the loss (`kl_coef != 0`
-> `== 0`), and `ent_coef` added instead of subtracted.
"""
import functools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loss_oracle as ref
from mtrl_jax.credit import (PolicyLossConfig, aggregate, decoupled_ppo_loss_bt, policy_loss,
                             ppo_clip_loss_bt, value_loss)

CONFIGS = {
    "default": PolicyLossConfig(),
    "dual_seqmean": PolicyLossConfig(dual_clip=3.0, agg="seq_mean_token_mean", max_turns=3),
    "everything": PolicyLossConfig(agg="seq_mean_token_sum", norm_len=5, kl_coef=0.3,
                                   kl_kind="k1", ent_coef=0.02, entropy_top_rho=0.3,
                                   nll_coef=0.4, dual_clip=2.0, max_turns=3),
    # Clip bounds exactly at ratio 1 (eps 0) and a cap exactly at weight 1.
    "zero_eps": PolicyLossConfig(eps_low=0.0, eps_high=0.0, dual_clip=1.5, behav_cap=1.0,
                                 kl_coef=0.0, kl_kind="k3"),
    "no_cap": PolicyLossConfig(behav_cap=None, agg="seq_mean_token_sum", eps_low=0.1,
                               eps_high=0.4, ent_coef=-0.1, nll_coef=0.0),
    # Coefficients of exactly 1 (a `coef != 0` test turned into `!= 1` shows here).
    "unit_coefs": PolicyLossConfig(kl_coef=1.0, ent_coef=1.0, nll_coef=1.0, dual_clip=4.0),
}


def inputs(seed: int, b: int, t: int):
  """Random [b, t] inputs with the special tokens listed in the module doc."""
  r = np.random.default_rng(seed)
  mask = (r.random((b, t)) < 0.75).astype(np.float32)
  mask[0, 0] = 1.0
  if b > 1:
    mask[-1] = 0.0  # a row without tokens
  behav = np.log(r.uniform(0.05, 1.0, (b, t)))
  logp = behav + r.normal(0, 0.4, (b, t))
  prox = behav + r.normal(0, 0.7, (b, t))
  adv = r.normal(0, 1.5, (b, t))
  special = r.integers(0, 8, (b, t))
  adv = np.where(special == 0, 0.0, adv)                       # A exactly 0
  adv = np.where(special == 1, r.uniform(0.1, 0.9, (b, t)), adv)  # 0 < A < 1
  logp = np.where(special == 2, prox, logp)                    # ratio exactly 1 (decoupled)
  prox = np.where(special == 3, behav, prox)                   # weight exactly 1
  prox = np.where(special == 4, behav + 2.0, prox)             # weight e^2 > 5: dropped
  logp = np.where(special == 5, behav + 1.5, logp)             # far outside the clip range
  logp = np.where(special == 6, behav, logp)                   # ratio exactly 1 (plain PPO)
  adv = np.where(special == 7, 0.0, adv)                       # A = 0 with the ratio far out
  logp = np.where(special == 7, np.maximum(behav, prox) + 1.6, logp)
  ent = np.round(r.uniform(0, 3, (b, t)) * 2) / 2               # ties
  turn = r.integers(-1, 5, (b, t))
  success = (r.random(b) < 0.6).astype(np.float32)
  seg = np.cumsum(r.random((b, t)) < 0.3, axis=1).astype(np.int32)  # 0, 0, 1, 1, 1, 2, ...
  ref_logp = behav + r.normal(0, 0.3, (b, t))
  off = mask == 0
  garbage = dict(logp=80.0, behav=-1e4, prox=-50.0, adv=1e6, ent=1e3, ref_logp=-1e4)
  out = dict(logp=logp, behav=behav, prox=prox, adv=adv, ent=ent, ref_logp=ref_logp)
  out = {k: np.where(off, garbage[k], v).astype(np.float32) for k, v in out.items()}
  out.update(mask=mask, turn=turn.astype(np.int32), success=success, seg=seg)
  return out


def f64(d):
  return {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
          for k, v in d.items()}


def _check(got, want, what):
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-6, err_msg=what)


# A few fixed shapes (each new shape compiles every operation again), one of them 1 x 1.
shapes = st.builds(lambda seed, bt: (seed, *bt), st.integers(0, 2**31 - 1),
                   st.sampled_from([(1, 1), (1, 5), (3, 6), (4, 7)]))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("decoupled", [False, True])
@settings(max_examples=8, deadline=None)
@given(shape=shapes, packed=st.booleans())
def test_policy_loss_matches_the_numpy_reference(name, decoupled, shape, packed):
  cfg = CONFIGS[name]
  x = inputs(*shape)
  d = f64(x)
  kw = dict(ref_logp_bt=jnp.asarray(x["ref_logp"]), entropy_bt=jnp.asarray(x["ent"]),
            turn_idx_bt=jnp.asarray(x["turn"]))
  rkw = dict(ref=d["ref_logp"], ent=d["ent"], turn=d["turn"])
  if decoupled:
    kw["prox_logp_bt"], rkw["prox"] = jnp.asarray(x["prox"]), d["prox"]
  if packed:
    kw["segment_ids_bt"], rkw["segment_ids"] = jnp.asarray(x["seg"]), x["seg"]
  if cfg.nll_coef:
    kw["success_b"], rkw["success"] = jnp.asarray(x["success"]), x["success"]
  loss, diag = policy_loss(cfg, jnp.asarray(x["logp"]), jnp.asarray(x["behav"]),
                           jnp.asarray(x["adv"]), jnp.asarray(x["mask"]), **kw)
  want, want_diag = ref.policy_loss(cfg, d["logp"], d["behav"], d["adv"], d["mask"], **rkw)
  _check(loss, want, "loss")
  assert set(diag) == set(want_diag)
  for k, v in want_diag.items():
    _check(diag[k], v, k)


@pytest.mark.parametrize("name", ["default", "dual_seqmean", "zero_eps", "no_cap"])
@settings(max_examples=8, deadline=None)
@given(shape=shapes)
def test_per_token_losses_and_flags_match_the_reference(name, shape):
  """ppo_clip_loss_bt and decoupled_ppo_loss_bt token by token, flags included."""
  cfg = CONFIGS[name]
  x = inputs(*shape)
  d = f64(x)
  clip = dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip)
  got, flags = ppo_clip_loss_bt(x["logp"], x["behav"], x["adv"], x["mask"], **clip)
  want, wflags = ref.ppo_terms(d["logp"], d["behav"], d["adv"], d["mask"], **clip)
  _check(got, want, "ppo loss_bt")
  for k in ("clip_low", "clip_high", "dual_clip"):
    assert np.asarray(flags[k]).tolist() == wflags[k].tolist(), k
  # Log-ratios are zeroed before exp on masked tokens (ppo.py's convention): ratio 1 there.
  _check(flags["ratio"], wflags["ratio"], "ratio")
  got, flags = decoupled_ppo_loss_bt(x["logp"], x["prox"], x["behav"], x["adv"], x["mask"],
                                     behav_cap=cfg.behav_cap, **clip)
  want, wflags = ref.ppo_terms(d["logp"], d["behav"], d["adv"], d["mask"], prox=d["prox"],
                               behav_cap=cfg.behav_cap, **clip)
  _check(got, want, "decoupled loss_bt")
  for k in ("clip_low", "clip_high", "dual_clip", "keep"):
    assert np.asarray(flags[k]).tolist() == wflags[k].tolist(), k
  for k in ("ratio", "behav_weight"):  # both exactly 1 on masked tokens
    _check(flags[k], wflags[k], k)
  assert np.all(np.asarray(flags["ratio"])[x["mask"] == 0] == 1.0)
  assert np.all(np.asarray(flags["behav_weight"])[x["mask"] == 0] == 1.0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
@settings(max_examples=8, deadline=None)
@given(shape=shapes, norm_len=st.sampled_from([None, 3]), packed=st.booleans())
def test_aggregate_matches_the_reference(mode, shape, norm_len, packed):
  """Each segment id in [0, T] of a row is one sequence (0 included); masked losses hold garbage."""
  x = inputs(*shape)
  seg = x["seg"] if packed else None
  if packed:  # ids up to T itself, and a mask-1 token of segment 0
    b, t = seg.shape
    seg = np.where(seg > 0, np.minimum(seg * 2, t), 0).astype(np.int32)
    seg[0, -1] = t
  loss = np.where(x["mask"] > 0, x["adv"], 1e6).astype(np.float32)
  got = aggregate(jnp.asarray(loss), jnp.asarray(x["mask"]), mode, norm_len,
                  None if seg is None else jnp.asarray(seg))
  want = ref.aggregate(loss.astype(np.float64), x["mask"], mode, norm_len, seg)
  _check(got, want, mode)


def test_segment_ids_out_of_range_stay_in_their_row():
  """Ids below 0 count as 0 and ids above T as T: never another row's sequence.

  Row 0: tokens 1, 3 with ids -4 and 9 (T = 2): sequences {1} (id 0) and {3} (id T);
  row 1: token 5 with id 0. Per-sequence mean: (1 + 3 + 5) / 3 = 3. Without the
  clip, id 9 of row 0 would be flat id 9 (past every row) and id -4 would drop the token.
  """
  loss = jnp.array([[1.0, 3.0], [5.0, 0.0]])
  mask = jnp.array([[1, 1], [1, 0]])
  seg = jnp.array([[-4, 9], [0, 0]])
  got = aggregate(loss, mask, "seq_mean_token_mean", segment_ids_bt=seg)
  np.testing.assert_allclose(got, 3.0)
  np.testing.assert_allclose(aggregate(loss, mask, "seq_mean_token_mean", segment_ids_bt=jnp.array([[0, 2], [0, 0]])),
                             3.0)


@pytest.mark.parametrize("clip_eps", [None, 0.2, 0.05])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@settings(max_examples=8, deadline=None)
@given(shape=shapes, packed=st.booleans())
def test_value_loss_matches_the_reference(clip_eps, agg, shape, packed):
  x = inputs(*shape)
  r = np.random.default_rng(shape[0])
  tgt = r.normal(0, 1, x["mask"].shape).astype(np.float32)
  v = (tgt + r.normal(0, 0.3, tgt.shape)).astype(np.float32)
  old = (v + r.normal(0, 0.3, tgt.shape)).astype(np.float32)
  off = x["mask"] == 0
  v, old, tgt = (np.where(off, g, a).astype(np.float32) for a, g in ((v, 1e4), (old, -1e4), (tgt, 7e3)))
  seg = x["seg"] if packed else None
  loss, diag = value_loss(jnp.asarray(v), jnp.asarray(old), jnp.asarray(tgt), jnp.asarray(x["mask"]),
                          clip_eps=clip_eps, agg=agg, norm_len=None,
                          segment_ids_bt=None if seg is None else jnp.asarray(seg))
  want, want_diag = ref.value_loss(*(a.astype(np.float64) for a in (v, old, tgt)), x["mask"],
                                   clip_eps=clip_eps, agg=agg, segment_ids=seg)
  _check(loss, want, "value loss")
  assert set(diag) == set(want_diag)
  for k, w in want_diag.items():
    _check(diag[k], w, k)


@functools.lru_cache(maxsize=None)
def _default_value_loss():
  return value_loss(jnp.array([[1.0]]), jnp.array([[0.5]]), jnp.array([[2.0]]), jnp.array([[1.0]]))


def test_value_loss_defaults_clip_at_0_2():
  """Default clip_eps .2: V 1, Vold .5, Vt 2 -> clip(1, .3, .7) = .7, loss .5 * 1.3^2 = .845."""
  loss, diag = _default_value_loss()
  np.testing.assert_allclose(loss, 0.845, rtol=1e-6)
  np.testing.assert_allclose(diag["value_clip_frac"], 1.0)
