"""The main job: one config, one workdir, every stage, resumable.

  python -m mtrl_jax.main --config=configs/default.py --workdir=/tmp/run
  python -m mtrl_jax.main --config=configs/ms_grpo.py:horizon=8 --workdir=... --config.rl.steps=50

Relaunching the same command continues from the last checkpoint in the workdir.
This file only reads the flags; the job itself is mtrl_jax/job.py's `run_job`
(exit codes: 0 done, 3 a non-finite loss, 1 any other error).
"""
from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:args]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and demos go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  from mtrl_jax.job import run_job
  # -v N on the command line keeps its level; otherwise the libraries' INFO logs stay quiet.
  level = None if flags.FLAGS["verbosity"].present else logging.WARNING
  sys.exit(run_job(_CONFIG.value, _WORKDIR.value, log_level=level).code)


if __name__ == "__main__":
  app.run(main)
