"""The main job: one config, one workdir, every stage, resumable.

  python -m mtrl_jax.main --config=configs/default.py --workdir=/tmp/run
  python -m mtrl_jax.main --config=configs/ms_grpo.py:horizon=8 --workdir=... --config.rl.steps=50

Relaunching the same command continues from the last checkpoint in the workdir.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:args]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and demos go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  from mtrl_jax import compile_cache
  from mtrl_jax import config as config_lib
  from mtrl_jax.metrics import say
  from mtrl_jax.train.learner import NonFiniteError
  from mtrl_jax.train.run import Run
  if not flags.FLAGS["verbosity"].present:
    # Library INFO logs (orbax, tfds) drown the progress lines; -v 0 brings them back.
    logging.set_verbosity(logging.WARNING)
  # JAX's persistent compilation cache (config.compile_cache), before anything compiles.
  config_lib.validate_compile_cache(_CONFIG.value)
  say(compile_cache.describe(compile_cache.setup(_CONFIG.value.compile_cache)))
  try:
    summary = Run(_CONFIG.value, _WORKDIR.value).run()
  except NonFiniteError as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    _exit_multihost(3)
    sys.exit(3)
  except BaseException as e:
    # On several processes, a peer that died makes the next collective here
    # fail at once; leaving normally would then wait in JAX's shutdown
    # barrier until the peer's heartbeat times out, and abort. Say why, and go.
    import jax
    if jax.process_count() > 1 and not isinstance(e, SystemExit):
      import traceback
      traceback.print_exc()
      print(f"error: process {jax.process_index()} of {jax.process_count()} stopped: {type(e).__name__}: "
            f"{str(e)[:500]}\nIf another process died (see its log), relaunch all processes with the same "
            "command: the run resumes from the last checkpoint.", file=sys.stderr)
      _exit_multihost(4)
    raise
  print(json.dumps({k: v for k, v in summary.items() if isinstance(v, (int, float))}))


def _exit_multihost(code: int) -> None:
  """Exits at once when several processes run (no shutdown barrier with a possibly dead peer)."""
  import jax
  if jax.process_count() > 1:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
  app.run(main)
