"""The critic bar on a user's own env: registered from outside the package, no decision declared.

Issue 43: on such an env the readout printed no oracle, so nothing told the user their critic
explained nothing. Here a lever env (the sign in the observation says which reply pays) is
registered by this test module, value pretraining runs two rounds on a tiny model, and the
readout must carry the empirical oracle (keyed by task and turn-0 reply), the ratio with its
interval, the verdict line in the run's summary, and the RL stage's warning.
"""
import numpy as np
import pytest

from mtrl_jax.config import base_config
from mtrl_jax.envs import registry
from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.train import critic_bar
from mtrl_jax.train.run import Run


@registry.register("test_user_levers")
class UserLevers(Env):
  """Turn 0: any reply; it pays 1 at the end when its first letter is the task's sign's parity.
  Turn 1: any reply. No first_decision, no decision_value: a user's env."""

  def __init__(self):
    self.max_turns = 2

  def _reset(self, seed):
    self.sign = self.rng.randrange(2)
    self.first = None
    return Reset("levers", f"sign {self.sign}")

  def _step(self, action):
    if self.turn == 0:
      self.first = action
      return Step("go on", 0.0, False, False, {})
    paid = bool(self.first) and ord(self.first[0]) % 2 == self.sign
    return Step("done", float(paid), True, False, {"success": paid})

  def expert_action(self):
    return "a" if self.sign else "b"

  def random_action(self, rng):
    return rng.choice("ab")


def _config():
  c = base_config()
  c.env.name, c.env.kwargs = "test_user_levers", {}
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = "separate"
  c.stages = ("value_pretrain", "rl")
  c.rl.update(estimator="gae", steps=1, tasks_per_update=4, group_size=4, minibatches=1, warmup_steps=0)
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 0.95}
  # Two rounds at a learning rate that cannot fit anything: a critic below the bar.
  c.value_pretrain.update(steps=2, tasks_per_round=8, epochs=1, minibatches=1, lr=1e-7, warmup_steps=0,
                          readout_tasks=16)
  # Near-greedy replies: a task's 4 sessions mostly reply alike, so its cells hold several sessions.
  c.rollout.update(turn_budget=2, context_cap=64, env_threads=2, temperature=0.3)
  c.checkpoint.update(every=10**6, async_save=False)
  c.log.tensorboard = False
  return c


@pytest.fixture(scope="module")
def record(tmp_path_factory):
  said = []
  with pytest.MonkeyPatch.context() as mp:
    import mtrl_jax.train.run as run_lib
    real_say = run_lib.say
    mp.setattr(run_lib, "say", lambda msg, *a, **kw: (said.append(msg), real_say(msg, *a, **kw)))
    run = Run(_config(), str(tmp_path_factory.mktemp("user_env")))
    summary = run.run()
  return {"summary": summary, "said": said, "run": run}


def test_a_user_env_declares_nothing():
  assert registry.first_decision_fn("test_user_levers") is None
  assert registry.decision_value_fn("test_user_levers", {}) is None


def test_user_env_readout_has_an_empirical_oracle_and_the_ratio(record):
  """The final readout reports the oracle's EV (task-keyed), the ratio and its interval.

  Break checked: the empirical oracle removed (readout_and_oracle returning the fit only when
  decision_fn is None, as before issue 43): no oracle key, no ratio, and the verdict is 'not judged'."""
  s = record["summary"]
  assert s["value_pretrain/oracle_task_keyed"] == 1.0
  assert s["value_pretrain/oracle_explained_variance"] > 0.2  # the sign explains the payoff
  assert np.isfinite(s["value_pretrain/ev_over_oracle_lo"]) and np.isfinite(s["value_pretrain/ev_over_oracle_hi"])
  assert s["value_pretrain/ev_over_oracle"] == pytest.approx(
      s["value_pretrain/explained_variance"] / s["value_pretrain/oracle_explained_variance"])


def test_summary_says_critic_below_the_bar_and_rl_warns(record):
  """An untrained critic: the summary's line starts 'critic below the bar' with the ratio, the run
  says it at the end, and the RL stage (gae) warns naming the ratio and what to change.

  Break checked: `_critic_check` not called in stage_rl (no warning; the summary keeps only value
  pretraining's line, so the warning assert fails)."""
  s = record["summary"]
  assert s["critic"].startswith("critic below the bar"), s["critic"]
  ratio = f"{s['value_pretrain/ev_over_oracle']:.2f}"
  warnings = [m for m in record["said"] if m.startswith("WARNING")]
  assert len(warnings) == 1 and ratio in warnings[0] and "value_pretrain.steps" in warnings[0], warnings
  assert any(m.startswith("summary: critic below the bar") for m in record["said"])


def test_rl_warning_by_readout():
  """critic_bar.rl_warning: none for a critic-free estimator or a critic at the bar; the ratio and
  the fix for one below it; 'uncertain' asks for a larger readout; no pretraining says so.

  Break checked: warning on 'uncertain' like 'below' (the readout_tasks advice missing)."""
  good = {"explained_variance": 0.4, "oracle_explained_variance": 0.42, "ev_over_oracle_lo": 0.85,
          "ev_over_oracle_hi": 1.05}
  bad = {**good, "explained_variance": 0.05, "ev_over_oracle_lo": 0.02, "ev_over_oracle_hi": 0.2}
  unsure = {**good, "explained_variance": 0.33, "ev_over_oracle_lo": 0.6, "ev_over_oracle_hi": 0.95}
  assert critic_bar.rl_warning("ms_grpo", bad, True) is None
  assert critic_bar.rl_warning("gae", good, True) is None
  w = critic_bar.rl_warning("turn_gae", bad, True)
  assert "critic below the bar" in w and "0.12 [0.02, 0.20]" in w and "value_pretrain.steps" in w
  assert "readout_tasks" in critic_bar.rl_warning("bilevel_gae", unsure, True)
  assert "not pretrained" in critic_bar.rl_warning("gae", None, False)
  assert critic_bar.verdict({"explained_variance": 0.1}).startswith("critic bar not judged")
