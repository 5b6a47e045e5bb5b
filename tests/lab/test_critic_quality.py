"""lab/credit_accuracy.critic_quality: the critic columns of the lab's table score the learner's
current critic on the lab's sessions, through the learner's own readout, with its intervals."""
import types

import numpy as np

from mtrl_jax.lab.credit_accuracy import CRITIC_BOOT, critic_quality
from mtrl_jax.train.learner import Learner


class FakeLearner:
  """Packs sessions into a tag, scores them with its critic's values, reads them out as EV = mean."""

  def __init__(self, values):
    self.values, self.seen = values, None

  def _pack(self, sessions):
    return ("packed", len(sessions))

  def score(self, pb):
    assert pb == ("packed", 3)
    return None, None, self.values

  def critic_readout(self, sessions, pb, values_bt, *, boot=0, seed=0):
    self.seen = (len(sessions), pb, np.asarray(values_bt), boot, seed)
    out = {"explained_variance": float(np.mean(values_bt)), "oracle_explained_variance": 0.6,
           "decision_gap": 0.25, "r2": -1.0}
    if boot:
      out.update(explained_variance_lo=0.4, explained_variance_hi=0.6, ev_over_oracle_lo=0.7,
                 ev_over_oracle_hi=float("nan"), readout_sessions=3)
    return out


def test_scores_the_values_the_learner_gives_for_these_sessions():
  """Break checked: passing zeros instead of score()'s values to the readout
  makes the EV 0.0 instead of 0.5. Keys the readout does not give are left out, extra ones dropped;
  the intervals are asked for (boot = CRITIC_BOOT, the run's seed) and kept, a NaN end as None.
  Catches the lab reading the readout without intervals (the critic bar then falls back to the
  point ratio on every run)."""
  learner = FakeLearner(np.full((3, 4), 0.5))
  got = critic_quality(learner, ["s0", "s1", "s2"], seed=7)
  assert got == {"explained_variance": 0.5, "oracle_explained_variance": 0.6, "decision_gap": 0.25,
                 "explained_variance_lo": 0.4, "explained_variance_hi": 0.6, "ev_over_oracle_lo": 0.7,
                 "ev_over_oracle_hi": None, "readout_sessions": 3}
  assert learner.seen[0] == 3 and learner.seen[1] == ("packed", 3)
  np.testing.assert_array_equal(learner.seen[2], np.full((3, 4), 0.5))
  assert learner.seen[3:] == (CRITIC_BOOT, 7) and CRITIC_BOOT >= 1000


def test_learner_readout_passes_boot_through():
  """Learner.critic_readout with boot > 0 returns critic_readout.readout's interval keys (the
  oracle's too, on a probe with a decision), with boot = 0 none. Catches the learner dropping
  `boot` (the lab's intervals would silently vanish)."""
  rng = np.random.default_rng(0)
  b, t = 16, 4
  arm = rng.integers(0, 2, b)
  target = np.repeat((0.2 + 0.7 * arm + rng.normal(0, 0.2, b))[:, None], t, axis=1)
  pb = types.SimpleNamespace(loss_mask_bt=np.ones((b, t)), turn_idx_bt=np.zeros((b, t), int),
                             group_id_b=np.arange(b) // 2, session_index_b=np.arange(b))
  sessions = [types.SimpleNamespace(turns=[types.SimpleNamespace(action="ab"[a], observation="")]) for a in arm]
  fake = types.SimpleNamespace(mc_targets=lambda pb: target, decision_fn=lambda a, o=None: a, decision_value=None)
  values = target + rng.normal(0, 0.1, (b, t))
  with_ci = Learner.critic_readout(fake, sessions, pb, values, boot=200, seed=1)
  assert with_ci["readout_sessions"] == b
  for k in ("explained_variance", "oracle_explained_variance", "ev_over_oracle"):
    assert with_ci[f"{k}_lo"] <= with_ci[f"{k}_hi"]
  assert "ev_over_oracle_lo" not in Learner.critic_readout(fake, sessions, pb, values)
