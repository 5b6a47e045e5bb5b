"""The share of generated tokens whose trainer/sampler importance ratio leaves
[0.9, 1.1] (train/scoring.py sampler_mismatch, "mismatch/ratio_out_share"), and the scoring step's
largest proximal / behaviour ratio (scored_stats, "update/ratio_prox_behav_max")."""
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.train.scoring import MISMATCH_RATIO_BAND, Scored, sampler_mismatch, scored_stats


def test_hand_worked_band_edges():
  """ratios 1.0, 1.05, 0.95, 1.2, 0.8 (and a stale 5.0, an observation 0.1):
  2 of 5 current-version generated tokens are outside. Catches (checked by a
  temporary edit) a band symmetric in log space (|log r| > log 1.1 would count
  0.905 as out)."""
  r = np.array([[1.0, 1.05, 0.95, 1.2, 0.8, 5.0, 0.1]])
  behav = np.full_like(r, -1.0)
  prox = behav + np.log(r)
  mask = np.array([[1, 1, 1, 1, 1, 1, 0]], np.float32)
  version = np.array([[4, 4, 4, 4, 4, 3, 4]])
  out = sampler_mismatch(prox, behav, mask, version, 4)
  assert out["mismatch/tokens"] == 5
  assert out["mismatch/ratio_out_share"] == 2 / 5
  # 0.905 is inside [0.9, 1.1] though |log 0.905| > log 1.1: the band is on the ratio.
  inside = sampler_mismatch(np.log([[0.905, 1.099]]), np.zeros((1, 2)), np.ones((1, 2)), np.zeros((1, 2)), 0)
  assert inside["mismatch/ratio_out_share"] == 0.0
  none = sampler_mismatch(prox, behav, mask, version, 9)
  assert none["mismatch/ratio_out_share"] == 0.0 and none["mismatch/tokens"] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-3.0, 3.0), st.booleans(), st.integers(0, 2)), min_size=1, max_size=40))
def test_share_equals_counting_ratios(rows):
  """Property: the share is (# current masked tokens with exp(prox - behav)
  outside [0.9, 1.1]) / (# current masked tokens), computed here on the ratios."""
  diff = np.array([d for d, _, _ in rows])[None]
  mask = np.array([m for _, m, _ in rows], np.float32)[None]
  version = np.array([v for _, _, v in rows])[None]
  behav = np.full_like(diff, -2.0)
  out = sampler_mismatch(behav + diff, behav, mask, version, 1)
  lo, hi = MISMATCH_RATIO_BAND
  ratio = np.exp((behav + diff) - behav)
  cur = (mask > 0) & (version == 1)
  want = float(((ratio < lo) | (ratio > hi))[cur].mean()) if cur.any() else 0.0
  assert abs(out["mismatch/ratio_out_share"] - want) < 1e-12


def test_largest_ratio_is_proximal_over_behaviour_on_the_loss_mask():
  """Ratios pi_prox / pi_behav of 1.0, 1.5 and 0.5 on loss tokens and 3.0 off the mask: the largest is 1.5.
  Breaks checked (scratch copy): the ratio inverted (exp(behav - prox) in scored_stats) reads 2.0; the
  mask ignored reads 3.0. The batch is a stand-in with the three fields scored_stats reads."""
  r = np.array([[1.0, 1.5, 0.5, 3.0]])
  behav = np.full_like(r, -2.0)
  pb = SimpleNamespace(behav_logp_bt=behav, loss_mask_bt=np.array([[1, 1, 1, 0]], np.float32),
                       version_bt=np.zeros((1, 4), np.int32))
  zeros = np.zeros_like(r)
  out = scored_stats(Scored(prox_logp_bt=behav + np.log(r), ref_logp_bt=zeros, values_bt=zeros), pb, version=0)
  assert abs(out["update/ratio_prox_behav_max"] - 1.5) < 1e-9
  assert out["mismatch/tokens"] == 3 and out["mismatch/ratio_out_share"] == 2 / 3
