"""`rollout.devices > 0` x the RL loop, in the quick tier (issue 34).

The slow test_device_split.py::test_split_run_equals_the_shared_run compares a
split run with a shared one over two updates of 24 sessions; this one runs a
single small split `Run` (sampler on fake CPU devices 6-7, learner on 0-5)
and checks what a user would see: every update plays on the weights of the
update before it.
"""
import jax
import numpy as np

from mtrl_jax.config import base_config

STEPS = 3


def _config():
  c = base_config()
  c.stages = ("rl",)
  c.critic.kind = "none"
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.env.kwargs.length = 1
  # 6 sessions per update: one minibatch divides over the 6 learner devices.
  c.rl.update(estimator="grpo", tasks_per_update=3, group_size=2, minibatches=1, steps=STEPS, lr=2e-2,
              warmup_steps=0, entropy_coef=0.05)
  c.rollout.update(turn_budget=4, context_cap=128, devices=2)
  c.sft.batch_size = 6  # validated against the 6 learner devices even with no sft stage
  c.eval.update(every=100, tasks=2, greedy=False)
  c.log.tensorboard = False
  c.checkpoint.update(every=10**6, async_save=False)
  return c


def _devices(tree) -> set:
  return {d.id for x in jax.tree.leaves(tree) for d in x.devices()}


def test_a_split_run_samples_each_update_from_the_previous_updates_weights(tmp_path):
  """3 RL updates with the sampler on its own devices: update k's sessions
  carry policy version k on every generated token, the sampler received
  versions 0..3 in order, each equal bit for bit to the learner's weights
  after the update that made it (and they moved), on devices 6-7 only.

  Bug caught (issue 34, checked on a scratch edit): the RL loop calling
  `self._sync_sampler()` only when `self.split.shared`: the sampler keeps
  version 0 through the updates: the versions the updates' sessions carry
  are [[0], [0], [0]] instead of [[0], [1], [2]].
  """
  from mtrl_jax.train.run import Run
  run = Run(_config(), str(tmp_path / "split"))
  assert {d.id for d in run.mesh.devices.flat} == {0, 1, 2, 3, 4, 5}
  got, learner_at, played, where = [], {}, [], set()
  set_params = run.sampler.set_params

  def spy_set(params, version):
    if not got or got[-1][0] != int(version):
      got.append((int(version), jax.tree.map(np.asarray, params)))
    where.update(_devices(params))
    return set_params(params, version)

  update = run.learner.update

  def spy_update(batch, step, **kw):
    played.append(sorted({int(v) for s in batch for t in s.turns for v in t.version}))
    met = update(batch, step, **kw)
    learner_at[run.learner.version] = jax.tree.map(np.asarray, run.learner.policy_params_for_sampler())
    return met

  run.sampler.set_params, run.learner.update = spy_set, spy_update
  learner_at[0] = jax.tree.map(np.asarray, run.learner.policy_params_for_sampler())
  run.run()

  assert played == [[k] for k in range(STEPS)]
  assert [v for v, _ in got] == list(range(STEPS + 1))
  assert where == {6, 7}
  for v, params in got:
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(learner_at[v]), strict=True):
      np.testing.assert_array_equal(a, b)
  moved = [max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(learner_at[v + 1]),
                                                             jax.tree.leaves(learner_at[v])))
           for v in range(STEPS)]
  assert min(moved) > 1e-4, moved
