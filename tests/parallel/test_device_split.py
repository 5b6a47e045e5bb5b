"""`rollout.devices`: the sampler on its own devices (2 of the 8 fake CPU
devices), the learner on the others (6); weights move learner -> sampler
after each update, and the run plays the shared-device run's sessions."""
import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.config import base_config
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel.device_split import SplitSamplerWeights, split_devices
from mtrl_jax.parallel.mesh import make_mesh
from mtrl_jax.parallel.rules import rules_from_config
from mtrl_jax.parallel.sharded_init import create_sharded
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


def _devices(tree) -> set:
  return {d.id for x in jax.tree.leaves(tree) for d in x.devices()}


def test_split_takes_the_last_devices_for_the_sampler():
  split = split_devices(2)
  ids = [d.id for d in jax.devices()]
  assert [d.id for d in split.sampler] == ids[6:] and [d.id for d in split.learner] == ids[:6]
  assert not split.shared and split_devices(0).shared
  for bad in (8, 9, -1):
    with pytest.raises(ValueError, match="config.rollout.devices"):
      split_devices(bad)


def test_weights_move_to_the_sampler_devices_and_decode_the_same():
  """Learner weights sharded over a 6-device fsdp mesh move onto the 2
  sampler devices (replicated; decode rows split over them): every leaf equal,
  nothing left on a learner device, the copy survives the learner's buffers
  being deleted (a donating step), and decoding there gives the tokens and
  log-probs of a sampler on the default device.

  Break checked: `SplitSamplerWeights.__call__` returning the learner's arrays
  as they are: the device check fails (learner devices 0-5).
  """
  split = split_devices(2)
  mesh = make_mesh((1, 6, 1), devices=list(split.learner))
  c = base_config()
  c.mesh.rules = "fsdp"
  rules = rules_from_config(c.mesh)
  model = create_sharded(lambda: Transformer(CFG, rngs=nnx.Rngs(0)), mesh, rules)
  gd, params = nnx.split(model)
  host = jax.tree.map(np.asarray, params)
  assert _devices(params) == {d.id for d in split.learner}

  move = SplitSamplerWeights(params, rules, split.sampler)
  moved = move(params)
  assert _devices(moved) == {d.id for d in split.sampler}
  for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(moved)):
    np.testing.assert_array_equal(a, np.asarray(b))
  jax.tree.map(lambda x: x.delete(), params)  # what the learner's donating step does to its buffers

  ref = Sampler(gd, jax.tree.map(jax.numpy.asarray, host), pad_id=0, stop_ids=[2], log_compiles=False)
  own = Sampler(gd, moved, pad_id=0, stop_ids=[2], log_compiles=False, mesh=move.mesh)
  prompts = [[5, 70, 80], [6, 71], [7, 72, 81, 90], [8]]
  keys = jax.random.split(jax.random.key(0), 4)
  outs = []
  for smp in (ref, own):
    state = smp.append(smp.init_state(4, 64), prompts)
    out, state = smp.generate(state, keys, 8, params=SamplingParams(temperature=1.0))
    outs.append(out)
  assert _devices(state) == {d.id for d in split.sampler}
  assert len(state.cache.length_b.sharding.device_set) == 2  # rows split over the sampler devices
  for a, b in zip(*[o.tokens for o in outs]):
    assert a.tolist() == b.tolist()
  for a, b in zip(*[o.logps for o in outs]):
    np.testing.assert_allclose(a, b, atol=1e-5)


def _config(devices: int):
  c = base_config()
  c.stages = ("rl",)
  c.critic.kind = "none"
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.env.kwargs.length = 1
  # 24 sessions per update: one minibatch divides over 8 (shared) and over 6 (split) learner devices.
  c.rl.update(estimator="grpo", tasks_per_update=6, group_size=4, minibatches=1, steps=2, lr=2e-2,
              warmup_steps=0, entropy_coef=0.05)
  c.rollout.update(turn_budget=4, context_cap=128, devices=devices)
  c.sft.batch_size = 24
  c.eval.update(every=100, tasks=2, greedy=False)
  c.log.tensorboard = False
  c.checkpoint.async_save = False
  return c


def _run(tmp_path, devices: int):
  """Runs the RL stage; returns (sessions of each update, {version: weights the sampler got},
  {version: learner weights after the update that made it}, devices of the sampler's weights)."""
  from mtrl_jax.train.run import Run
  run = Run(_config(devices), str(tmp_path / f"d{devices}"))
  got, learner_at, sessions, where = {}, {}, [], set()
  set_params = run.sampler.set_params

  def spy_set(params, version):
    got[int(version)] = jax.tree.map(np.asarray, params)
    where.update(_devices(params))
    return set_params(params, version)

  update = run.learner.update

  def spy_update(batch, step, **kw):
    sessions.append([s.to_dict() for s in batch])
    met = update(batch, step, **kw)
    learner_at[run.learner.version] = jax.tree.map(np.asarray, run.learner.policy_params_for_sampler())
    return met

  run.sampler.set_params, run.learner.update = spy_set, spy_update
  learner_at[0] = jax.tree.map(np.asarray, run.learner.policy_params_for_sampler())
  run.run()
  return sessions, got, learner_at, where, {d.id for d in run.mesh.devices.flat}


@pytest.mark.slow
def test_split_run_equals_the_shared_run(tmp_path):
  """Two RL updates with the sampler on devices 6-7 and the learner on 0-5,
  against the same run on shared devices: after each update the sampler's
  weights equal the learner's (bit for bit, and they moved: each update
  changes them by far more than any tolerance), they live on the sampler's
  devices only, and every update trains on the shared run's sessions (same
  tokens; log-probs to 1e-5: the learners' gradient sums differ in order).

  Break checked: `Run._sync_sampler` called only before the first update's
  rollouts in the split run: the sampler never gets the version-1 weights
  (versions [0, 2] instead of [0, 1, 2]; update 2 plays on version 0).
  """
  shared = _run(tmp_path, 0)
  split = _run(tmp_path, 2)
  sessions, got, learner_at, where, learner_devices = split
  assert where == {6, 7} and learner_devices == {0, 1, 2, 3, 4, 5}
  assert sorted(got) == [0, 1, 2]
  for v in (0, 1, 2):
    for a, b in zip(jax.tree.leaves(got[v]), jax.tree.leaves(learner_at[v])):
      np.testing.assert_array_equal(a, b)
  step = [np.linalg.norm(np.concatenate([np.ravel(a - b) for a, b in
                                         zip(jax.tree.leaves(learner_at[v + 1]), jax.tree.leaves(learner_at[v]))]))
          for v in (0, 1)]
  assert min(step) > 1e-3, step
  assert len(sessions) == len(shared[0]) == 2
  for batch_a, batch_b in zip(shared[0], sessions):
    assert len(batch_a) == len(batch_b) == 24
    for x, y in zip(batch_a, batch_b):
      assert [t["action_ids"] for t in x["turns"]] == [t["action_ids"] for t in y["turns"]]
      np.testing.assert_allclose(np.concatenate([t["logp"] for t in x["turns"]]),
                                 np.concatenate([t["logp"] for t in y["turns"]]), atol=1e-5)
