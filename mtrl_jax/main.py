"""The main job: one config, one workdir, every stage, resumable.

  python -m mtrl_jax.main --config=configs/default.py --workdir=/tmp/run
  python -m mtrl_jax.main --config=configs/ms_grpo.py:horizon=8 --workdir=... --config.rl.steps=50

Relaunching the same command continues from the last checkpoint in the workdir.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:args]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and demos go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  from mtrl_jax.train.learner import NonFiniteError
  from mtrl_jax.train.run import Run
  if not flags.FLAGS["verbosity"].present:
    # Library INFO logs (orbax, tfds) drown the progress lines; -v 0 brings them back.
    logging.set_verbosity(logging.WARNING)
  try:
    summary = Run(_CONFIG.value, _WORKDIR.value).run()
  except NonFiniteError as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(3)
  print(json.dumps({k: v for k, v in summary.items() if isinstance(v, (int, float))}))


if __name__ == "__main__":
  app.run(main)
