"""The README's main job: credit assignment on the `memory` probe, on a CPU.

A tiny byte-level decoder (2 layers, d=64) is warm-started by behaviour
cloning on low-quality demonstrations (half the actions random), then
MS-GRPO (the whole episode return credited to every turn) trains it. The
decisive action (peek at the code, at a small cost) pays off only at the last
turn, `length + 1` turns later.

Command:
  python -m mtrl_jax.main --config=configs/default.py --workdir=/tmp/mtrl_default
Args: `configs/default.py:length=6,runlocal=true` (runlocal: a 1-minute smoke run),
`seed=N` (the same as `--config.seed=N`; a sweep's grid key).
Expected on a 2-core CPU: docs/main_job.md (measured numbers and the plot).
"""
from configs.common import default_config, shrink
from mtrl_jax.config_args import parse_args


def get_config(arg=None):
  a = parse_args(arg, {"length": 3, "runlocal": False, "seed": 0, "penalty": 0.1})
  c = default_config(a["length"])
  c.seed = a["seed"]
  c.env.kwargs.invalid_penalty = a["penalty"]
  return shrink(c) if a["runlocal"] else c
