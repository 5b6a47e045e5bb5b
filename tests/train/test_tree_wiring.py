"""The RL stage plays trees when config.rollout.tree.enabled; eval keeps chains."""
from mtrl_jax.config import base_config
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.tree import TreeRolloutEngine
from mtrl_jax.sampling.sampler import SamplingParams
from mtrl_jax.train.run import Run


def test_run_builds_a_tree_engine_for_rl_only(tmp_path):
  """Catches a config flag that never reaches the engine (a chain engine for
  RL) and trees leaking into evaluation (group size 1 is not whole trees)."""
  c = base_config()
  c.stages = ()
  c.critic.kind = "none"
  c.rl.estimator = "tree"
  c.rl.group_size = 4
  c.rollout.tree.update(enabled=True, branch_turns=(1,), width=4)
  c.log.tensorboard = False
  c.checkpoint.async_save = False
  run = Run(c, str(tmp_path))
  eng = run._engine(4, SamplingParams(), tree=True)
  assert isinstance(eng, TreeRolloutEngine) and eng.tree.branch_turns == (1,) and eng.roots == 1
  assert type(run._engine(1, SamplingParams())) is RolloutEngine
  c.rollout.tree.enabled = False
  assert type(run._engine(4, SamplingParams(), tree=True)) is RolloutEngine
