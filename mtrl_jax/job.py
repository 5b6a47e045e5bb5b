"""One job: a config and a workdir in, every stage run, an exit code out.

`run_job` is the one place that sets up what a run needs around its stages:
the library log level, JAX's persistent compilation cache (config.compile_cache,
before anything compiles), the stages themselves (`Run(config, workdir).run()`),
the summary line (one JSON object of the run's numbers, on stdout) and the exit
code. The main job (main.py), the in-process runner (inprocess.py) and the lab
call it.

Exit codes: 0 done; 3 a non-finite loss (NonFiniteError: the last good state is
in the checkpoint); 1 any other error (its traceback on stderr). On several
processes (jax.distributed) a failing process leaves at once with 3 or 4 (see
`_exit_multihost`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from typing import Any, Optional

from absl import logging

DONE, FAILED, NON_FINITE = 0, 1, 3
PEER_LOST = 4  # several processes: this one stopped, a peer may have died


@dataclasses.dataclass
class JobResult:
  """What a job ended with.

  code: the exit code (DONE, FAILED, NON_FINITE).
  summary: the run's summary (Run.run()'s dict: final evals, times, compile counts); {} on failure.
  run: the Run object once built (the lab reads its sampler and learner), else None.
  error: the exception that ended the job, else None.
  """
  code: int
  summary: dict
  run: Any = None
  error: Optional[BaseException] = None


def run_job(config, workdir: str, *, log_level: Optional[int] = logging.WARNING) -> JobResult:
  """Runs every stage of `config` in `workdir` (resuming from its checkpoint) in this process.

  `log_level`: the absl level for the libraries' logs (WARNING: orbax's and tfds's INFO lines
  drown the progress lines); None leaves the level as it is (main's --verbosity).
  """
  from mtrl_jax import config as config_lib
  from mtrl_jax.compile import cache
  from mtrl_jax.metrics import say
  from mtrl_jax.train.learner import NonFiniteError
  from mtrl_jax.train.run import Run
  if log_level is not None:
    logging.set_verbosity(log_level)
  run = None
  try:
    # JAX's persistent compilation cache, before anything compiles (a folder already set stays open).
    config_lib.validate_compile_cache(config)
    say(cache.describe(cache.setup(config.compile_cache)))
    run = Run(config, workdir)
    summary = run.run()
  except NonFiniteError as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    _exit_multihost(NON_FINITE)
    return JobResult(NON_FINITE, {}, run, e)
  except BaseException as e:
    _exit_multihost_after(e)
    if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: the caller's to handle
      raise
    traceback.print_exc()  # a failed run is its exit code, as a process's would be: the next run goes on
    return JobResult(FAILED, {}, run, e)
  print(json.dumps({k: v for k, v in summary.items() if isinstance(v, (int, float))}), flush=True)
  return JobResult(DONE, summary, run)


def _exit_multihost_after(e: BaseException) -> None:
  """On several processes, a peer that died makes the next collective here fail at once; leaving
  normally would then wait in JAX's shutdown barrier until the peer's heartbeat times out, and
  abort. Say why, and go (exit code PEER_LOST)."""
  import jax
  if jax.process_count() > 1 and not isinstance(e, SystemExit):
    traceback.print_exc()
    print(f"error: process {jax.process_index()} of {jax.process_count()} stopped: {type(e).__name__}: "
          f"{str(e)[:500]}\nIf another process died (see its log), relaunch all processes with the same "
          "command: the run resumes from the last checkpoint.", file=sys.stderr)
    _exit_multihost(PEER_LOST)


def _exit_multihost(code: int) -> None:
  """Exits at once when several processes run (no shutdown barrier with a possibly dead peer)."""
  import jax
  if jax.process_count() > 1:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
