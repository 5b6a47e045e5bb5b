"""The estimators the lab scores: every registered one, plus named variants.

Each entry: (registry name, hyper-parameters, critic). critic is None (no
critic), 'mc' (the critic value pretraining fits on Monte-Carlo targets,
lambda_critic = 1, as the trainer does) or 'coupled' (the same critic
fitted further on lambda_critic = 0.95 targets: classic GAE, where the
critic bootstraps with the policy's lambda).
"""
from __future__ import annotations

from mtrl_jax.credit import registry as credit_registry

CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")

VARIANTS = {
    "gae_lambda0.95": ("gae", {"lambda_policy": 0.95, "lambda_critic": 0.95}, "coupled"),
    "gae_lambda1": ("gae", {"lambda_policy": 1.0, "lambda_critic": 1.0}, "mc"),
    "gae_decoupled": ("gae", {"lambda_policy": 0.95, "lambda_critic": 1.0}, "mc"),  # VC-PPO
    "gae_length_adaptive": ("gae", {"length_adaptive": True, "lambda_critic": 1.0}, "mc"),  # VAPO
    "turn_gae": ("turn_gae", {}, "mc"),
    "bilevel_gae": ("bilevel_gae", {}, "mc"),
    "grpo": ("grpo", {}, None),
    "ms_grpo": ("ms_grpo", {}, None),
    "rloo": ("rloo", {}, None),
    "return_to_go": ("return_to_go", {}, None),
    "tree": ("tree", {}, None),
}


def lab_estimators(names=None) -> dict:
  """name -> (registry name, hparams, critic); `names` picks a subset (None: all).

  Registered estimators the table above does not cover are added with their
  defaults, so a newly registered estimator is scored without editing the lab.
  """
  table = dict(VARIANTS)
  covered = {v[0] for v in table.values()}
  for name in credit_registry.estimator_names():
    if name not in covered:
      table[name] = (name, {}, "mc" if name in CRITIC_ESTIMATORS else None)
  if names:
    unknown = sorted(set(names) - set(table))
    if unknown:
      raise ValueError(f"unknown lab estimator(s) {unknown}; known: {sorted(table)}")
    table = {n: table[n] for n in names}
  for name, (reg, hp, _) in table.items():
    credit_registry.make_advantage_fn(reg, **hp)  # validates the hyper-parameters now
  return table
