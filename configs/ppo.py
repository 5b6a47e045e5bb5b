"""PPO with a critic: gae | turn_gae | bilevel_gae, decoupled and length-adaptive lambda.

The critic is initialised from the warm-started policy and pretrained on
Monte Carlo returns of the frozen policy (VC-PPO/VAPO) before RL.

Commands:
  python -m mtrl_jax.main --config=configs/ppo.py:estimator=gae --workdir=/tmp/ppo
  python -m mtrl_jax.main --config=configs/ppo.py:estimator=turn_gae,lambda_policy=0.95 --workdir=...
  python -m mtrl_jax.main --config=configs/ppo.py:estimator=gae,adaptive=true --workdir=...
  python -m mtrl_jax.main --config=configs/ppo.py:runlocal=true --workdir=...   (about a minute)
Expected: value pretraining reaches a positive explained variance; with
lambda_policy < 1 and gamma < 1 the first-turn credit shrinks with the horizon.
"""
from configs.common import build


def get_config(arg=None):
  return build(arg, estimators=("gae", "turn_gae", "bilevel_gae"), default_estimator="gae",
               critic="separate", extra={"lambda_policy": 0.95, "lambda_critic": 1.0, "adaptive": False})
