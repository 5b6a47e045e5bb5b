"""The learner hands the newer estimators their per-turn inputs: the env's
anchor state keys (gigpo, hgpo), its turn rewards (mt_grpo) and the progress
head's shares (progress), and reports how many turns found a step group."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtrl_jax.credit import compute_advantages
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.train import progress as progress_head
from tiny_world import G, T, TOK, learner, world


class KeyedSpreadEnv(Env):
  """Reward = the action's length mod 3 (a random policy gets spread returns);
  the state is the turn and the parity of the last action's length, so sessions
  of a task meet in some states and not in others; an action of odd length is
  'invalid' (a turn reward of 0)."""

  def __init__(self):
    self.max_turns = 3

  def _reset(self, seed):
    self.parity = 0
    return Reset("spread", f"go {seed % 10}")

  def _step(self, action):
    self.parity = len(action) % 2
    return Step("go", float(len(action) % 3), False, False, {"invalid_action": len(action) % 2 == 1})

  def state_key(self):
    return "t0" if self.turn == 0 else f"t{self.turn}:{self.parity}"

  def expert_action(self):
    return "ab"

  def random_action(self, rng):
    return "a" * rng.randrange(3)


@functools.lru_cache(maxsize=None)
def keyed_sessions():
  _, _, _, params, sampler, _ = world()
  from mtrl_jax.train.async_source import copy_params
  sampler.set_params(copy_params(params), 0)
  engine = RolloutEngine(sampler, TOK, KeyedSpreadEnv, group_size=G, turn_token_budget=4, context_cap=128,
                         num_env_threads=2, env_name="keyed")
  out = engine.run([300 + j for j in range(T)], jax.random.key(5)).sessions
  assert len({s.episode_return for s in out}) > 1
  return tuple(out)


def _batch(pb, **extra) -> CreditBatch:
  return CreditBatch(reward_bt=jnp.asarray(pb.reward_bt), loss_mask_bt=jnp.asarray(pb.loss_mask_bt),
                     turn_idx_bt=jnp.asarray(pb.turn_idx_bt), group_id_b=jnp.asarray(pb.group_id_b),
                     episode_id_b=jnp.asarray(pb.episode_id_b), tree_id_b=jnp.asarray(pb.tree_id_b),
                     return_b=jnp.asarray(pb.return_b), **extra)


def _grouped_by_hand(sessions) -> tuple[int, int]:
  """(turns, turns sharing (group, state key) with another turn), from the session records."""
  keys = [(s.group_id, k) for s in sessions for k in s.state_keys()]
  return len(keys), sum(keys.count(k) > 1 for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gigpo", "hgpo"])
def test_step_group_estimators_get_the_env_state_keys(estimator):
  """The learner's advantages are the estimator's on the packed state ids,
  which differ from those without (so the keys matter here), and the update
  reports the grouped turns counted from the session records.
  Break checked: the learner not passing `state_id_bt` (gigpo falls back
  to its episode term everywhere) fails both checks."""
  sessions = list(keyed_sessions())
  lrn = learner(estimator=estimator)
  pb = lrn._pack(sessions)
  adv, _ = lrn.advantages(pb, np.zeros(pb.reward_bt.shape, np.float32))
  want, _ = compute_advantages(estimator, _batch(pb, state_id_bt=jnp.asarray(pb.state_id_bt)))
  without, _ = compute_advantages(estimator, _batch(pb))
  np.testing.assert_allclose(np.asarray(adv), np.asarray(want), rtol=1e-6, atol=1e-7)
  assert np.abs(np.asarray(want) - np.asarray(without)).max() > 0.1
  turns, grouped = _grouped_by_hand(sessions)
  met = lrn.update(sessions, step=0)
  assert met["credit/step_turns"] == turns and met["credit/step_grouped_turns"] == grouped
  assert 0 < grouped < turns
  assert met["credit/step_grouped_fraction"] == pytest.approx(grouped / turns)


def test_mt_grpo_gets_the_env_turn_rewards():
  """The turn rewards of the step infos (0 for an odd-length action) reach mt_grpo.
  Break checked: the learner not passing `turn_reward_bt` (mt_grpo = grpo) fails."""
  sessions = list(keyed_sessions())
  assert {t.info["turn_reward"] for s in sessions for t in s.turns} == {0.0, 1.0}
  lrn = learner(estimator="mt_grpo")
  pb = lrn._pack(sessions)
  adv, _ = lrn.advantages(pb, np.zeros(pb.reward_bt.shape, np.float32))
  want, _ = compute_advantages("mt_grpo", _batch(pb, turn_reward_bt=jnp.asarray(pb.turn_reward_bt)))
  grpo, _ = compute_advantages("grpo", _batch(pb))
  np.testing.assert_allclose(np.asarray(adv), np.asarray(want), rtol=1e-6, atol=1e-7)
  assert np.abs(np.asarray(want) - np.asarray(grpo)).max() > 0.1


@pytest.mark.slow
def test_progress_head_trains_beside_the_policy_and_its_shares_reach_the_estimator():
  """The first update starts the head from the policy's trunk, fits it
  (`config.progress.steps` steps: its loss falls) and the advantages are
  progress's on the head's shares. Break checked: the head never fitted
  (steps skipped) leaves its zero head: the loss does not fall and the
  shares are all 0, and this fails."""
  sessions = list(keyed_sessions())
  lrn = learner(estimator="progress")
  lrn.progress = progress_head.ProgressTrainer(30, 3e-3, seed=0)  # a fresh head per test
  pb = lrn._pack(sessions)
  lrn.progress.init_from_policy(lrn.policy_gd, lrn.state.policy)
  before = lrn.progress.loss(progress_head.arrays(pb))
  adv, _ = lrn.advantages(pb, np.zeros(pb.reward_bt.shape, np.float32))
  after = lrn.credit_stats["progress/fit_loss"]
  assert after < 0.5 * before, (before, after)
  shares = lrn.progress.shares(progress_head.arrays(pb))
  assert np.abs(shares).max() > 0.05
  want, _ = compute_advantages("progress", _batch(pb, progress_bt=jnp.asarray(shares)))
  np.testing.assert_allclose(np.asarray(adv), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_progress_settings_are_validated_naming_the_field():
  from configs.common import default_config
  from mtrl_jax.config import validate
  c = default_config()
  c.rl.estimator = "progress"
  c.progress.steps = 0
  with pytest.raises(ValueError, match="progress.steps"):
    validate(c, num_devices=1)
  c.progress.steps, c.progress.lr = 5, -1.0
  with pytest.raises(ValueError, match="progress.lr"):
    validate(c, num_devices=1)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gigpo", "hgpo", "mt_grpo", "progress"])
def test_main_job_runs_each_new_estimator(tmp_path, estimator):
  """`--config.rl.estimator=NAME` on the main job (smoke size) runs RL to the end and logs what the
  estimator reports (step-group counts; the progress head's fit)."""
  from main_helpers import run_main
  from mtrl_jax.metrics import read_metrics
  proc = run_main(str(tmp_path), f"--config.rl.estimator={estimator}", "--config.stages=('demos','sft','rl')")
  assert proc.returncode == 0, proc.stderr[-3000:]
  rl = [r for r in read_metrics(str(tmp_path)) if r["stage"] == "rl" and "update/batch_rows" in r]
  assert len(rl) == 3
  if estimator in ("gigpo", "hgpo"):
    assert all(r["credit/step_keyed_turns"] == r["credit/step_turns"] > 0 for r in rl)  # memory names its states
  if estimator == "progress":
    assert all(np.isfinite(r["progress/fit_loss"]) for r in rl)
