"""config.rl.aaw: absolute-advantage-weighted episode subsampling in the learner."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tiny_world import G, T, flat, host, learner, sessions_v0
from mtrl_jax.config import base_config, validate
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.rollout.packing import pack_sessions
from mtrl_jax.train.credit_step import aaw_rows


@pytest.mark.parametrize("field, value, match", [
    ("aaw_fraction", 0.0, "config.rl.aaw_fraction"),
    ("aaw_fraction", 1.5, "config.rl.aaw_fraction"),
    ("aaw_floor", -0.1, "config.rl.aaw_floor"),
])
def test_bad_aaw_fields_are_named(field, value, match):
  c = base_config()
  c.rl[field] = value
  with pytest.raises(ValueError, match=match):
    validate(c, num_devices=1)


def test_aaw_needs_an_outcome_estimator():
  c = base_config()
  c.rl.update(aaw=True, estimator="gae")
  with pytest.raises(ValueError, match=r"config.rl.aaw: .*grpo"):
    validate(c, num_devices=1)
  c.rl.estimator = "ms_grpo"
  validate(c, num_devices=1)


def _hand_probs(sessions, floor):
  """p_i = (|A_i| + floor) / sum, A_i = (R_i - mean_g R) / (std_g R + 1e-6), in numpy."""
  ret = np.array([s.episode_return for s in sessions], np.float64)
  grp = np.array([s.group_id for s in sessions])
  adv = np.zeros_like(ret)
  for g in np.unique(grp):
    r = ret[grp == g]
    adv[grp == g] = (r - r.mean()) / (r.std() + 1e-6)
  w = np.abs(adv) + floor
  return w / w.sum()


def test_drawn_episodes_follow_the_absolute_advantage_weights():
  """One episode drawn per key, 20000 keys, on a per-turn packed batch (two
  rows per episode): every row of a drawn episode is kept together, and the
  episode frequencies pass a chi-square test against the hand-computed
  (|A| + floor)-weights while failing it against uniform weights.

  Break checked: `aaw_rows` drawing with floor ignored (`floor=0.0` passed
  to `aaw_sample`), or uniformly (adv zeroed): the chi-square test fails.
  """
  sessions = list(sessions_v0(0))
  floor, n = 0.25, 20000
  p = _hand_probs(sessions, floor)
  assert p.max() > 2 * p.min()  # weights far apart: a uniform draw is easy to tell
  pb = pack_sessions(sessions, layout="turn", context="history")
  credit = CreditBatch(jnp.asarray(pb.reward_bt), jnp.asarray(pb.loss_mask_bt), jnp.asarray(pb.turn_idx_bt),
                       jnp.asarray(pb.group_id_b), jnp.asarray(pb.episode_id_b), jnp.asarray(pb.tree_id_b),
                       jnp.asarray(pb.return_b))
  keys = jax.random.split(jax.random.key(3), n)
  keep_nb = np.asarray(jax.jit(jax.vmap(lambda k: aaw_rows(k, credit, 1, floor)))(keys))
  sess_b = pb.session_index_b
  assert np.all(keep_nb[:, sess_b < 0] == False)  # noqa: E712  (padding rows never)
  drawn_ns = np.stack([keep_nb[:, sess_b == i].all(1) for i in range(len(sessions))], 1)
  partial = np.stack([keep_nb[:, sess_b == i].any(1) for i in range(len(sessions))], 1) & ~drawn_ns
  assert not partial.any()  # an episode comes with all its turn rows or not at all
  assert np.all(drawn_ns.sum(1) == 1)
  counts = drawn_ns.sum(0)
  assert len(sessions) == 8
  crit = 29.8775  # chi-square, 7 degrees of freedom, upper 1e-4 quantile (scipy.stats.chi2.ppf)
  chi2 = np.sum((counts - n * p) ** 2 / (n * p))
  assert chi2 < crit, (chi2, crit, counts / n, p)
  uniform = np.full(len(sessions), n / len(sessions))
  assert np.sum((counts - uniform) ** 2 / uniform) > 10 * crit


def _shift_behaviour_logp(sessions, which, delta=-1.0):
  out = []
  for s in sessions:
    if s.session_id in which:
      s = dataclasses.replace(s, turns=[t._replace(logp=t.logp + delta) for t in s.turns])
    out.append(s)
  return out


def test_the_learner_trains_on_the_drawn_episodes_only():
  """aaw_fraction 0.5 of T x G episodes, per-turn layout.

  Changing the behaviour log-probs of the episodes NOT drawn leaves the update
  bit-for-bit the same; changing those of a drawn one changes it a lot (the
  decoupled loss weighs each token by pi_prox / pi_behav).

  Break checked: the `if rl.aaw:` subsampling in `Learner.update` skipped
  (every row trained): the first comparison fails.
  """
  sessions = list(sessions_v0(0))
  lrn = learner(layout="turn", aaw=True, aaw_fraction=0.5, aaw_floor=0.0)
  p0 = flat(host(lrn.state.policy))
  met = lrn.update(sessions, 0)
  drawn = set(lrn.last_aaw_session_ids)
  p_ref = flat(host(lrn.state.policy))
  assert met["aaw/episodes_drawn"] == len(drawn) == round(0.5 * T * G)
  step_size = np.linalg.norm(p_ref - p0)
  assert step_size > 1e-2

  undrawn = {s.session_id for s in sessions} - drawn
  lrn = learner(layout="turn", aaw=True, aaw_fraction=0.5, aaw_floor=0.0)
  lrn.update(_shift_behaviour_logp(sessions, undrawn), 0)
  assert set(lrn.last_aaw_session_ids) == drawn
  np.testing.assert_array_equal(flat(host(lrn.state.policy)), p_ref)

  lrn = learner(layout="turn", aaw=True, aaw_fraction=0.5, aaw_floor=0.0)
  lrn.update(_shift_behaviour_logp(sessions, {min(drawn)}), 0)
  assert np.linalg.norm(flat(host(lrn.state.policy)) - p_ref) > 0.01 * step_size
