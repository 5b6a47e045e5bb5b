"""Decoupled PPO on stale data: the learner recomputes the proximal log-probs and
trains with them, not with the actors' behaviour log-probs."""
import jax
import jax.numpy as jnp
import numpy as np

from tiny_world import flat, host, learner, sessions_v0
from mtrl_jax.credit.losses import policy_loss
from mtrl_jax.parallel.sharded_step import sharding_context
from mtrl_jax.train.async_source import copy_params
from mtrl_jax.train.rl_step import LearnerState, RLBatch, StepFlags, forward


def test_stale_update_uses_the_learners_proximal_logprobs():
  """Sessions sampled at version 0 trained by a learner at version 3.

  Checks (1) the proximal log-probs the learner scores differ from the
  recorded behaviour log-probs by a wide margin (the data really is stale);
  (2) the loss the learner reports equals the decoupled loss computed by hand
  with pi_prox = those proximal log-probs, and not the one with
  pi_prox = pi_behav; (3) the parameters after the update equal one step on
  the hand-built batch with the proximal log-probs, far from the step with the
  behaviour ones.

  Break checked: `prox_logp_bt=pb.behav_logp_bt` in `Learner.update` (the
  behaviour log-probs passed as proximal): (2) fails (loss off by ~15%).
  """
  lrn = learner()
  stale = list(sessions_v0(0))
  for step, batch in enumerate([sessions_v0(1), sessions_v0(2), sessions_v0(1)]):
    lrn.update(list(batch), step)  # moves the learner away from the behaviour policy
  assert lrn.version == 3 and {s.max_version() for s in stale} == {0}

  pb = lrn._pack(stale)
  prox, ref, values = (np.asarray(x) for x in lrn.score(pb))
  adv = np.asarray(lrn.advantages(pb, jnp.asarray(values), jnp.asarray(prox), jnp.asarray(ref))[0])
  m = pb.loss_mask_bt > 0
  behav = pb.behav_logp_bt
  gap = np.abs(prox - behav)[m]
  assert gap.mean() > 0.03, gap.mean()  # on-policy it is ~1e-6 (test_async_source); here ~0.1
  assert np.abs(adv[m]).max() > 0.1  # the advantages are not all 0

  # (2) The loss by hand, at the learner's current weights.
  params = host(lrn.state.policy)
  stats, _ = forward(lrn.policy_gd, params, jnp.asarray(pb.tokens_bt), jnp.asarray(pb.targets_bt),
                     jnp.asarray(pb.positions_bt))
  logp = stats.logp_bt

  def hand_loss(prox_bt):
    loss, _ = policy_loss(lrn.loss_cfg, logp, jnp.asarray(behav), jnp.asarray(adv), jnp.asarray(pb.loss_mask_bt),
                          prox_logp_bt=jnp.asarray(prox_bt), entropy_bt=stats.entropy_bt)
    return float(loss)

  loss_prox, loss_behav = hand_loss(prox), hand_loss(behav)
  assert abs(loss_prox - loss_behav) > 0.1 * abs(loss_prox), (loss_prox, loss_behav)

  # (3) One step of the learner's own jitted step on hand-built batches.
  def hand_step(prox_bt):
    batch = RLBatch(tokens_bt=pb.tokens_bt, targets_bt=pb.targets_bt, positions_bt=pb.positions_bt,
                    loss_mask_bt=pb.loss_mask_bt, behav_logp_bt=behav, prox_logp_bt=prox_bt, ref_logp_bt=ref,
                    adv_bt=adv, value_target_bt=np.zeros_like(adv), old_value_bt=values,
                    turn_idx_bt=pb.turn_idx_bt,
                    success_bt=np.broadcast_to(pb.success_b[:, None], pb.tokens_bt.shape).copy())
    st = lrn.state
    state = LearnerState(copy_params(st.policy), copy_params(st.opt_policy), {}, {})
    flags = StepFlags(jnp.float32(1.0), jnp.float32(0.0), jnp.float32(0.0))
    with sharding_context(lrn.mesh, lrn.rules):
      new, _ = lrn._step(state, lrn._put(batch), flags)
    return flat(host(new.policy))

  p0 = flat(params)
  p_prox, p_behav = hand_step(prox), hand_step(behav)
  met = lrn.update(stale, 3)
  p_learner = flat(host(lrn.state.policy))

  np.testing.assert_allclose(met["total_loss"], loss_prox, rtol=1e-4, atol=1e-6)
  assert abs(met["total_loss"] - loss_behav) > 100 * abs(met["total_loss"] - loss_prox)
  step_gap = np.linalg.norm(p_prox - p_behav)
  assert step_gap > 0.05 * np.linalg.norm(p_prox - p0), (step_gap, np.linalg.norm(p_prox - p0))
  # Same step as with pi_prox, up to summation order (the learner permutes the rows).
  assert np.linalg.norm(p_learner - p_prox) < 0.01 * step_gap
