"""The estimators the lab scores: every registered one, plus named variants.

Each entry: (registry name, hyper-parameters, critic). critic is None (no
critic), 'mc' (the critic value pretraining fits on Monte-Carlo targets,
lambda_critic = 1, as the trainer does), 'coupled' (the same critic
fitted further on lambda_critic = 0.95 targets: classic GAE, where the
critic bootstraps with the policy's lambda) or 'progress' (no critic: the
per-turn shares of a progress head the lab fits, train/progress.py).

The per-turn-normalisation probe's rows (docs/lab.md, `cashout`):
`reward_norm_then_sum` normalises each turn's reward over the group's
sessions that have that turn index and sums the normalised rewards to the
end (the per-turn MT-GRPO port verl issue #7244 reports biased),
`reward_norm_then_sum_padded` counts the sessions that already ended as
reward 0 at the later turn indices, and `return_to_go` (the registry's
default) is the other order: sum to the end, then normalise per turn index.

One name, one variant: a name the study's configs/study.py ARMS also uses
means the same registry estimator and hyper-parameters there
(tests/experiments/test_arm_names.py). A hyper-parameter away from the
estimator's default is in the name: `gae_length_adaptive` is VAPO's
alpha 0.05 (gae's default: lambda_policy = 1 - 1/(0.05 l), 0.23 on a
26-token session), `gae_length_adaptive_alpha2` the study's arm (alpha 2:
lambda ~0.98 at 26 tokens, VAPO's regime on the study's short sessions).
"""
from __future__ import annotations

from mtrl_jax.credit import registry as credit_registry

CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")

VARIANTS = {
    "gae_lambda0.95": ("gae", {"lambda_policy": 0.95, "lambda_critic": 0.95}, "coupled"),
    "gae_lambda1": ("gae", {"lambda_policy": 1.0, "lambda_critic": 1.0}, "mc"),
    "gae_decoupled": ("gae", {"lambda_policy": 0.95, "lambda_critic": 1.0}, "mc"),  # VC-PPO
    "gae_length_adaptive": ("gae", {"length_adaptive": True, "lambda_critic": 1.0}, "mc"),  # VAPO, alpha 0.05
    "gae_length_adaptive_alpha2": ("gae", {"length_adaptive": True, "alpha": 2.0, "lambda_critic": 1.0}, "mc"),
    "turn_gae": ("turn_gae", {}, "mc"),
    "bilevel_gae": ("bilevel_gae", {}, "mc"),
    "grpo": ("grpo", {}, None),
    "ms_grpo": ("ms_grpo", {}, None),
    "rloo": ("rloo", {}, None),
    "return_to_go": ("return_to_go", {}, None),
    "tree": ("tree", {}, None),
    "gigpo": ("gigpo", {}, None),
    "hgpo": ("hgpo", {}, None),
    "mt_grpo": ("mt_grpo", {}, None),
    "progress": ("progress", {}, "progress"),
    "reward_norm_then_sum": ("mt_grpo", {"turn_signal": "reward", "turn_credit": "normalise_then_sum",
                                         "outcome_weight": 0.0}, None),  # verl #7244's construction
    "reward_norm_then_sum_padded": ("mt_grpo", {"turn_signal": "reward", "turn_credit": "normalise_then_sum",
                                                "outcome_weight": 0.0, "pad_finished": True}, None),
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
