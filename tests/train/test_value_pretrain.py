"""Critic-only updates (`Learner.update(train_policy=False)`: the RL stage's critic
warm-up, `config.rl.critic_warmup`) fit the critic and leave the policy alone.
Value pretraining has its own step (train/value_pretrain.py), tested through
`Run` in test_run_stages.py."""
import numpy as np

from tiny_world import flat, host, learner, sessions_v0, trees_equal


def test_separate_critic_moves_and_the_policy_is_bit_identical():
  """Break checked: `StepFlags(jnp.float32(True), ...)` in `Learner.update`
  (train_policy ignored): the policy moves and the comparison fails."""
  lrn = learner("separate")
  before = host(lrn.state)
  met = lrn.update(list(sessions_v0(0)), 0, train_policy=False, epochs=4)
  assert met["update/nonfinite_steps"] == 0
  after = host(lrn.state)
  assert trees_equal(before.policy, after.policy)
  assert trees_equal(before.opt_policy, after.opt_policy)
  moved = np.abs(flat(after.critic) - flat(before.critic))
  assert moved.max() > lrn.c.rl.critic_lr, moved.max()  # 4 Adam steps of up to ~lr each


def test_value_head_moves_and_the_shared_trunk_is_bit_identical():
  """With critic.kind='head' only the value head may change.

  Break checked: train_policy ignored as above (the trunk moves); also
  `_mask_head_update` returning `new_p` unmasked (the value loss moves the
  trunk once the head is non-zero): both fail here.
  """
  lrn = learner("head")
  before = host(lrn.state.policy)
  lrn.update(list(sessions_v0(0)), 0, train_policy=False, epochs=4)
  after = host(lrn.state.policy)
  assert trees_equal(before["policy"], after["policy"])
  moved = np.abs(flat(after["value_head"]) - flat(before["value_head"]))
  assert moved.max() > lrn.c.rl.lr, moved.max()
