"""The rollout switches reach the engines (config.rollout.continuous, rows,
decode_chunk, in_flight, group_prefill, partial) and bad values name their field."""
import pytest

from mtrl_jax.config import base_config, validate
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import SamplingParams
from mtrl_jax.train.run import Run


def _config():
  c = base_config()
  c.stages = ()
  c.critic.kind = "none"
  c.rl.estimator = "grpo"
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.log.tensorboard = False
  c.checkpoint.async_save = False
  return c


def test_run_builds_the_engine_the_config_asks_for(tmp_path):
  """Catches a switch that never reaches the engine (lockstep played although
  continuous was asked for, or a knob silently left at its default).
  Break checked: `partial=False` hard-coded in `Run._engine`: fails."""
  c = _config()
  c.rollout.update(continuous=True, rows=3, decode_chunk=5, in_flight=7, group_prefill=True, partial=True)
  eng = Run(c, str(tmp_path / "a"))._engine(4, SamplingParams())
  assert isinstance(eng, ContinuousEngine)
  assert (eng.rows, eng.chunk, eng.in_flight, eng.group_prefill, eng.partial) == (3, 5, 7, True, True)
  c = _config()
  c.rollout.group_prefill = True
  eng = Run(c, str(tmp_path / "b"))._engine(4, SamplingParams())
  assert type(eng) is RolloutEngine and eng.group_prefill


@pytest.mark.parametrize("change, field", [
    ({"rows": -1}, "rollout.rows"),
    ({"decode_chunk": 0}, "rollout.decode_chunk"),
    ({"in_flight": -1}, "rollout.in_flight"),
    ({"partial": True}, "rollout.partial"),  # needs the continuous engine
    ({"devices": 8}, "rollout.devices"),  # leaves the learner nothing
    ({"devices": -1}, "rollout.devices"),
])
def test_bad_rollout_values_name_their_field(change, field):
  c = _config()
  c.rollout.update(change)
  with pytest.raises(ValueError, match=f"config.{field}"):
    validate(c)


def test_continuous_and_group_prefill_refuse_trees():
  for switch, field in (("continuous", "rollout.continuous"), ("group_prefill", "rollout.group_prefill")):
    c = _config()
    c.rl.group_size = 4
    c.rollout.tree.update(enabled=True, branch_turns=(1,), width=2)
    c.rollout[switch] = True
    with pytest.raises(ValueError, match=f"config.{field}"):
      validate(c)


def test_split_devices_leave_the_learner_mesh_the_rest():
  """With 2 of 8 devices sampling, the learner's batch must divide 6, not 8.
  Break checked: `_validate_mesh` counting all 8 devices: does not raise."""
  c = _config()
  c.rollout.devices = 2
  c.rl.update(tasks_per_update=8, group_size=4, minibatches=1)  # 32 sessions: divide 8, not 6
  validate(c, num_devices=8)  # the same config is fine for a learner on all 8
  with pytest.raises(ValueError, match="config.rl.minibatches"):
    validate(c)
  c.sft.batch_size = 24
  c.rl.update(tasks_per_update=6, group_size=4, minibatches=1)
  validate(c)
