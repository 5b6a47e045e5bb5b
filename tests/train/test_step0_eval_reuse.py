"""RL's step-0 evaluation reuses the SFT stage's when the policy has not changed in between.

The SFT stage ends with an evaluation of its policy, and the RL stage begins with one of its warm start:
in one process that is the same policy on the same held-out tasks, and for a real model on a CPU each
evaluation costs tens of minutes (SmolLM2 on BabyAI: ~20, issue 39). Run keeps the SFT evaluation with
the identity of the policy's arrays and writes it as RL's step 0 while they are the same objects.
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


def _run(tmp_path, monkeypatch, perturb: bool):
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
  workdir = str(tmp_path / ("nudged" if perturb else "plain"))
  Run(tiny_config(), workdir).run()
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
