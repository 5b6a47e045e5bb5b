"""lab/credit_accuracy.critic_quality: the critic columns of the lab's table score the learner's
current critic on the lab's sessions, through the learner's own readout."""
import numpy as np

from mtrl_jax.lab.credit_accuracy import critic_quality


class FakeLearner:
  """Packs sessions into a tag, scores them with its critic's values, reads them out as EV = mean."""

  def __init__(self, values):
    self.values, self.seen = values, None

  def _pack(self, sessions):
    return ("packed", len(sessions))

  def score(self, pb):
    assert pb == ("packed", 3)
    return None, None, self.values

  def critic_readout(self, sessions, pb, values_bt):
    self.seen = (len(sessions), pb, np.asarray(values_bt))
    return {"explained_variance": float(np.mean(values_bt)), "oracle_explained_variance": 0.6,
            "decision_gap": 0.25, "r2": -1.0}


def test_scores_the_values_the_learner_gives_for_these_sessions():
  """Break checked: passing zeros instead of score()'s values to the readout
  makes the EV 0.0 instead of 0.5. Keys the readout does not give are left out, extra ones dropped."""
  learner = FakeLearner(np.full((3, 4), 0.5))
  got = critic_quality(learner, ["s0", "s1", "s2"])
  assert got == {"explained_variance": 0.5, "oracle_explained_variance": 0.6, "decision_gap": 0.25}
  assert learner.seen[0] == 3 and learner.seen[1] == ("packed", 3)
  np.testing.assert_array_equal(learner.seen[2], np.full((3, 4), 0.5))
