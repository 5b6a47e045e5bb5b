"""MS-GRPO (arXiv 2508.10839): the episode return credited to every turn, one sample per turn.

`context=history` trains each turn with the full transcript before it;
`context=markov` (the paper's setting) with only the prompt and the current
observation. `layout=session` is the cheaper equivalent of history context.

Commands:
  python -m mtrl_jax.main --config=configs/ms_grpo.py:context=markov --workdir=/tmp/msgrpo
  python -m mtrl_jax.main --config=configs/ms_grpo.py:horizon=8 --workdir=...
  python -m mtrl_jax.main --config=configs/ms_grpo.py:runlocal=true --workdir=...   (about a minute)
Expected: on memory (length 3) comparable to configs/default.py; markov
context cannot recall the code (it is not in the current observation), so its
success stays near the guessing rate: a built-in sanity check of the layout.
"""
from configs.common import build


def get_config(arg=None):
  c = build(arg, estimators=("ms_grpo",), default_estimator="ms_grpo", critic="none",
            extra={"context": "history", "layout": "turn"})
  return c
