"""Outcome-level group estimators on multi-turn envs: grpo | rloo | tree | return_to_go.

Each session is one sequence; the estimator decides how the late reward is
spread over its turns (grpo/rloo: the same for all; return_to_go: discounted
by gamma over turns, the contrast case to MS-GRPO).

Commands:
  python -m mtrl_jax.main --config=configs/grpo.py:estimator=grpo --workdir=/tmp/grpo
  python -m mtrl_jax.main --config=configs/grpo.py:estimator=return_to_go,gamma=0.5 --workdir=...
  python -m mtrl_jax.main --config=configs/grpo.py:estimator=rloo,env=keydoor --workdir=...
  python -m mtrl_jax.main --config=configs/grpo.py:runlocal=true --workdir=...   (about a minute)
Expected: on memory (length 3) grpo and rloo behave like the default MS-GRPO
run (docs/main_job.md); return_to_go with gamma < 1 under-credits the first turn.
"""
from configs.common import build


def get_config(arg=None):
  return build(arg, estimators=("grpo", "rloo", "tree", "return_to_go"), default_estimator="grpo",
               critic="none")
