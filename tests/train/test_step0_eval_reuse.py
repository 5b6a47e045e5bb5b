"""An evaluation of a policy already evaluated on the same tasks reuses the numbers.

The SFT stage ends with an evaluation of its policy and the RL stage begins with one of its warm start;
RL's last update is evaluated and the final stage evaluates the same policy again. In one process these
are the same policy on the same held-out tasks with the same key, and for a real model on a CPU each
evaluation costs tens of minutes (SmolLM2 on BabyAI: ~9-20, issue 39). Run keeps the last evaluation
with the identity of the policy's arrays and the task count (Run._done_eval).
"""
import json
import os

import jax
import jax.numpy as jnp
import pytest

from mtrl_jax.config import base_config
from mtrl_jax.train import run as run_lib
from mtrl_jax.train.run import Run


def tiny_config():
  c = base_config()
  c.env.name, c.env.kwargs = "bifurcation", {"length": 1}
  c.model.update(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.critic.kind = "none"
  c.value_pretrain.enabled = False
  c.stages = ("demos", "sft", "value_pretrain", "rl")
  c.demos.episodes = 8
  c.sft.update(steps=3, batch_size=8)
  c.rl.update(estimator="ms_grpo", steps=1, tasks_per_update=2, group_size=4, minibatches=1, warmup_steps=0)
  c.rollout.update(turn_budget=4, context_cap=160, env_threads=2)
  c.eval.update(every=1, tasks=4, greedy=False)
  c.checkpoint.update(every=10**6, async_save=False)
  c.log.tensorboard = False
  return c


def _run(tmp_path, monkeypatch, perturb: bool, final_stage: bool = False, tasks: int = 64):
  calls = []
  real = run_lib.evaluate

  def counted(*a, **k):
    calls.append(1)
    return real(*a, **k)

  monkeypatch.setattr(run_lib, "evaluate", counted)
  if perturb:  # a stage between SFT and RL that changes the policy (as a critic head's pretraining may)
    def nudge(self):
      st = self.learner.state
      self.learner.state = st._replace(policy=jax.tree.map(lambda x: x + jnp.asarray(0.5, x.dtype), st.policy))
    monkeypatch.setattr(Run, "stage_value_pretrain", nudge)
  workdir = str(tmp_path / f"{'nudged' if perturb else 'plain'}{tasks}")
  c = tiny_config()
  if final_stage:  # the final stage plays max(eval.tasks, 64) tasks: 64 here, as RL's evaluations
    c.stages = (*c.stages, "eval")
    c.eval.tasks = tasks
  Run(c, workdir).run()
  recs = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = {(r["stage"], r["step"]): r for r in recs if "eval/success" in r}
  return calls, evals


def test_rl_step0_is_the_sft_evaluation_when_the_policy_is_unchanged(tmp_path, monkeypatch):
  """Catches: RL evaluating its unchanged warm start again (3 evaluations, not 2), or writing something
  other than the SFT stage's numbers as its step 0."""
  calls, evals = _run(tmp_path, monkeypatch, perturb=False)
  assert len(calls) == 2  # the SFT stage's and RL's after its one update
  sft, step0 = evals[("sft", 3)], evals[("rl", 0)]
  assert {k: v for k, v in sft.items() if k.startswith("eval/")} == \
         {k: v for k, v in step0.items() if k.startswith("eval/")}


def test_a_changed_policy_is_evaluated_again(tmp_path, monkeypatch):
  """Catches: reusing the SFT evaluation after the policy changed (a check that always reuses, or one
  that compares the policy dict and not its arrays)."""
  calls, evals = _run(tmp_path, monkeypatch, perturb=True)
  assert len(calls) == 3
  assert ("rl", 0) in evals


def test_the_final_stage_reuses_the_last_rl_evaluation_and_a_different_task_count_does_not(tmp_path, monkeypatch):
  """Catches: the final stage evaluating RL's last policy again on the same 64 tasks (3 evaluations,
  not 2), or writing other numbers as the final ones."""
  calls, evals = _run(tmp_path, monkeypatch, perturb=False, final_stage=True)
  assert len(calls) == 2  # SFT's (= RL's step 0) and RL's after its one update (= the final stage's)
  last, final = evals[("rl", 1)], evals[("eval", 1)]
  assert {k: v for k, v in last.items() if k.startswith("eval/")} == \
         {k: v for k, v in final.items() if k.startswith("eval/")}


def test_the_final_stage_on_more_tasks_than_rl_evaluates_again(tmp_path, monkeypatch):
  """Catches: reusing an evaluation of the same policy on a different number of tasks (RL's evaluations
  play 4, the final stage max(4, 64) = 64): 2 evaluations instead of 3, and the final numbers RL's."""
  calls, evals = _run(tmp_path, monkeypatch, perturb=False, final_stage=True, tasks=4)
  assert len(calls) == 3
  assert ("eval", 1) in evals
