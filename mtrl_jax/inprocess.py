"""Many runs in one process: the main job's command lines, run one after another here.

A study or sweep launches each run as `python -m mtrl_jax.main --config=... --workdir=...`:
every process starts JAX again and compiles every program again (or loads it
from the persistent cache). Run here instead, the runs share this process's
compiled programs: the jitted steps are built once per spec of what determines
the program (mtrl_jax/compile/programs.py), so a second run of equal shapes
(another seed, an arm that changes no program) compiles nothing.

A run is still exactly `mtrl_jax.main`: the same config loading
(ml_collections config file + `--config.FIELD=VALUE` overrides, locked), the
same job (mtrl_jax/job.py's `run_job`: stages, summary line, exit codes 0 done,
3 non-finite loss, 1 any other error), its stdout/stderr appended to the same
`<workdir>/log.txt` the subprocess launcher writes (appended: a relaunched
run's log keeps the killed attempt's traceback). Resuming is the same too: the
workdir's checkpoint decides where a run starts.

  from mtrl_jax.inprocess import run_argv
  rc, secs = run_argv(["--config=configs/default.py:seed=1", "--workdir=/tmp/r1"], log_path="/tmp/r1/log.txt")

Runs on one process only (no jax.distributed job: a pod runs one run per
launch), one at a time (the runs share stdout redirection and the device).
"""
from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import time

# The checkout this package sits in: runs start here, as the launchers start `python -m mtrl_jax.main`.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_argv(argv: list[str]):
  """(locked config, workdir) from main's flags: --config=FILE[:ARGS], --config.F=V..., --workdir=DIR.

  The config file is loaded by ml_collections' config_flags, as in main.py, so an
  override with a typo or a wrong type fails here as it would there.
  """
  from absl import flags
  from ml_collections import config_flags
  fv = flags.FlagValues()
  full = ["mtrl_jax.main", *argv]
  # sys_argv: the overrides are read from these flags, not from this process's command line.
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", flag_values=fv, lock_config=True,
                                  sys_argv=full)
  flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and demos go.", flag_values=fv)
  fv(full)
  if fv["config"].value is None or not fv["workdir"].value:
    raise ValueError(f"a run needs --config=... and --workdir=...: got {shlex.join(argv)}")
  return fv["config"].value, fv["workdir"].value


def argv_of(cmd: list[str]) -> list[str]:
  """main's flags from a launcher's command `[python, -m, mtrl_jax.main, *flags]`."""
  if "mtrl_jax.main" not in cmd:
    raise ValueError(f"not a main-job command (python -m mtrl_jax.main ...): {shlex.join(cmd)}")
  return list(cmd[cmd.index("mtrl_jax.main") + 1:])


class _Tee(io.TextIOBase):
  """Writes to a log file (what the subprocess launcher captures)."""

  def __init__(self, f):
    self.f = f

  def write(self, s):
    self.f.write(s)
    return len(s)

  def flush(self):
    self.f.flush()


def run_argv(argv: list[str], log_path: str | None = None) -> tuple[int, float]:
  """One main job in this process: (exit code as main.py gives it, wall seconds).

  With `log_path`, the run's stdout and stderr are appended there (as the
  launchers do for a subprocess); otherwise they go to this process's.
  """
  t0 = time.time()
  # Config files import `configs.common`: found from the repo root, as `python -m` there finds it.
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  ctx = contextlib.ExitStack()
  with ctx:
    if log_path:
      os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
      log = ctx.enter_context(open(log_path, "a"))
      log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} in-process: {shlex.join(argv)}\n")
      log.flush()
      out = _Tee(log)
      ctx.enter_context(contextlib.redirect_stdout(out))
      ctx.enter_context(contextlib.redirect_stderr(out))
    rc = _run(argv)
  return rc, time.time() - t0


def _run(argv: list[str]) -> int:
  try:
    c, workdir = parse_argv(argv)
  except Exception as e:  # absl: a bad flag; ml_collections: a bad override
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1
  from mtrl_jax.job import run_job
  cwd = os.getcwd()
  try:
    os.chdir(REPO)  # relative paths in a config (demos, init_from) mean what they mean to main, run from here
    return run_job(c, workdir).code
  finally:
    os.chdir(cwd)


def run_commands(jobs: list[tuple[str, list[str], str]]):
  """Yields (name, rc, seconds) per launcher job (name, [python -m mtrl_jax.main ...], workdir), in order.

  Each run's output goes to <workdir>/log.txt, as `sweep.run_one` writes it.
  """
  for name, cmd, workdir in jobs:
    os.makedirs(workdir, exist_ok=True)
    rc, secs = run_argv(argv_of(cmd), log_path=os.path.join(workdir, "log.txt"))
    yield name, rc, secs
