"""A step whose gradients are not finite leaves the whole learner state untouched."""
import numpy as np
import pytest

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


def test_a_finite_loss_with_nonfinite_gradients_is_refused(monkeypatch, request):
  """What a bad kernel or an overflow in the backward pass gives: the loss is
  finite (and equal to the clean one), only the gradients are not.

  A custom-VJP identity on the policy's log-probs passes values through and
  multiplies their cotangents by inf, so the policy gradients are inf and
  NaN (inf x 0) while the loss is unchanged. The update must be counted as non-finite and
  leave the policy, the critic and both Adam states bit-identical.

  Break checked (issue 20): `ok = jnp.isfinite(loss)` in rl_step (the
  gradient norms not checked): the poisoned gradients are applied, the policy
  and its Adam moments turn NaN and the state comparison fails.
  """
  import jax
  import jax.numpy as jnp

  import mtrl_jax.train.rl_step as rl_step
  from tiny_world import _learner

  @jax.custom_vjp
  def poison_grad(x):
    return x

  poison_grad.defvjp(lambda x: (x, None), lambda _, g: (g * jnp.inf,))
  # The clean reference of its own, stepped (so traced) before the patch: jit traces at
  # the first call, and the cached learner may or may not have been traced by other tests
  # in this worker (an order-dependent failure seen under xdist).
  clean = _learner.__wrapped__("separate", (("max_nonfinite", 99),))
  batch = list(sessions_v0(0))
  init = host(clean.state)
  ref = clean.update(batch, 1)
  moved = host(clean.state.policy)
  real = rl_step.policy_loss
  monkeypatch.setattr(rl_step, "policy_loss", lambda cfg, logp, *a, **k: real(cfg, poison_grad(logp), *a, **k))
  # A learner of its own (not the cached one): its step is traced with the patch in place. The
  # process-wide program cache (mtrl_jax/compile/programs.py) would hand it the clean learner's step of the
  # same key, so it is emptied before (the patched step is built anew) and, after, given back what it
  # held (no later test of this worker may get the poisoned program, and none has to compile again
  # the programs earlier tests shared: clearing it for good cost every later test of the worker its
  # compiles).
  from mtrl_jax.compile import programs
  held = programs.held()
  programs.clear()
  request.addfinalizer(lambda: programs.give_back(held))
  lrn = _learner.__wrapped__("separate", (("max_nonfinite", 99),))
  lrn.update(list(sessions_v0(1)), 0)  # refused as well: the state is still the initial one
  before = host(lrn.state)
  assert trees_equal(before.policy, init.policy)
  assert lrn.nonfinite_total == 1

  met = lrn.update(batch, 1)
  assert np.isfinite(met["total_loss"]) and met["total_loss"] == pytest.approx(ref["total_loss"], rel=1e-6)
  assert met["update/nonfinite_steps"] == 1 and lrn.nonfinite_total == 2
  assert not np.isfinite(met["grad_norm_policy"])
  after = host(lrn.state)
  for part in ("policy", "opt_policy", "critic", "opt_critic"):
    assert trees_equal(getattr(before, part), getattr(after, part)), part
  # The clean learner, same batch: its policy moved by about the learning rate.
  assert np.abs(flat(moved) - flat(before.policy)).max() > 0.5 * clean.c.rl.lr
