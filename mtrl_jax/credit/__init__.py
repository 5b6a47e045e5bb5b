"""Credit assignment: advantage estimators, policy / value losses, shaping.

Pure jnp array math over a `CreditBatch`; imports nothing else from mtrl_jax.
Entry points: `compute_advantages(name, batch, **hparams)`,
`policy_loss(cfg, ...)`, `value_loss(...)`. See docs/credit.md.
"""
from mtrl_jax.credit.aaw import aaw_probabilities, aaw_sample
from mtrl_jax.credit.batch import CreditBatch, make_credit_batch
from mtrl_jax.credit.diagnostics import explained_variance, per_turn_mean_std
from mtrl_jax.credit.gae import adaptive_lambda
from mtrl_jax.credit.losses import PolicyLossConfig, nll_loss, policy_loss, value_loss
from mtrl_jax.credit.ppo import aggregate, decoupled_ppo_loss_bt, ppo_clip_loss_bt
from mtrl_jax.credit.regularizers import (entropy_from_logits, kl_estimate,
                                          kl_reward_penalty)
from mtrl_jax.credit.registry import (compute_advantages, estimator_names,
                                      hparam_defaults, make_advantage_fn, register)
from mtrl_jax.credit.shaping import (collect_informative_groups,
                                     informative_group_mask, informative_groups_np,
                                     overlong_penalty, shape_overlong)
from mtrl_jax.credit.token_mask import high_entropy_mask

__all__ = [
    "CreditBatch", "make_credit_batch", "compute_advantages", "make_advantage_fn",
    "estimator_names", "hparam_defaults", "register", "adaptive_lambda",
    "PolicyLossConfig", "policy_loss", "value_loss", "nll_loss", "aggregate",
    "ppo_clip_loss_bt", "decoupled_ppo_loss_bt", "kl_estimate", "kl_reward_penalty",
    "entropy_from_logits", "high_entropy_mask", "explained_variance",
    "per_turn_mean_std", "informative_groups_np", "informative_group_mask",
    "collect_informative_groups", "overlong_penalty", "shape_overlong",
    "aaw_probabilities", "aaw_sample",
]
