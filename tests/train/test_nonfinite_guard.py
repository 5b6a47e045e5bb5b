"""A step whose gradients are not finite leaves the whole learner state untouched."""
import numpy as np

from tiny_world import flat, host, learner, sessions_v0, trees_equal


def test_nonfinite_gradients_leave_params_and_optimiser_state_bit_identical():
  """The `poison` hook scales the loss by NaN, so every gradient is NaN.

  The skipped update must leave the policy, the critic and both Adam states
  bit-identical (a finite update first, so the moments are not all zero),
  while the same update without poison moves the parameters by about the
  learning rate.

  Break checked: `_keep_if` bypassed in rl_step (`policy = new_p`,
  `opt_policy = opt_p`, same for the critic): the NaN update is applied and
  the state comparison fails.
  """
  lrn = learner("separate")
  batch = list(sessions_v0(0))
  lrn.update(list(sessions_v0(1)), 0)  # Adam moments and count are now non-zero
  before = host(lrn.state)

  met = lrn.update(batch, 1, poison=float("nan"))
  assert met["update/nonfinite_steps"] == 1
  # The hook poisons the gradients, not only the loss: the guard is tested on what it guards.
  assert not np.isfinite(met["grad_norm_policy"]) and not np.isfinite(met["grad_norm_critic"])
  after = host(lrn.state)
  for part in ("policy", "opt_policy", "critic", "opt_critic"):
    assert trees_equal(getattr(before, part), getattr(after, part)), part

  met = lrn.update(batch, 1)
  assert met["update/nonfinite_steps"] == 0
  moved = host(lrn.state)
  lr = lrn.c.rl.lr
  assert np.abs(flat(moved.policy) - flat(before.policy)).max() > 0.5 * lr
  assert np.abs(flat(moved.critic) - flat(before.critic)).max() > 0.5 * lrn.c.rl.critic_lr
