"""rl.whiten_advantages reaches the learner's advantages (train/credit_step.py), and only them."""
import numpy as np

from mtrl_jax.credit.whiten import masked_whiten
from mtrl_jax.rollout.packing import pack_sessions
from tiny_world import learner, sessions_v0


def test_the_learner_trains_on_gaes_advantages_whitened_and_keeps_its_value_targets():
  """GAE against a critic that over-values every state (3.0, above every return; every TD error shifted
  down, the collapse credit/whiten.py is for): with rl.whiten_advantages the learner's advantages are the plain
  learner's through masked_whiten (mean 0, spread 1 over the action tokens), and its value targets are
  GAE's, unchanged (the critic still fits the returns).

  Breaks checked: the option dropped in CreditSetup.from_config fails the comparison (the raw
  advantages, mean far below 0); the value targets whitened as well fails their equality."""
  pb = pack_sessions(list(sessions_v0()))
  values = np.full(pb.reward_bt.shape, 3.0, np.float32)
  adv, target = (np.asarray(x) for x in learner("separate", estimator="gae").advantages(pb, values))
  got, got_target = (np.asarray(x) for x in learner("separate", estimator="gae",
                                                    whiten_advantages=True).advantages(pb, values))
  mask = np.asarray(pb.loss_mask_bt) > 0
  assert np.ptp(adv[mask]) > 0.1 and adv[mask].mean() < -0.1  # an offset whitening removes
  np.testing.assert_allclose(got, np.asarray(masked_whiten(adv, np.asarray(pb.loss_mask_bt))), rtol=1e-5, atol=1e-6)
  assert abs(got[mask].mean()) < 1e-4 and abs(got[mask].std() - 1.0) < 1e-3
  np.testing.assert_array_equal(got_target, target)
