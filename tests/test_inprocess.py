"""mtrl_jax/inprocess.py and job.py: a main job run in this process, its log and exit codes.

The run's stages are stood in for (train/run.Run replaced) so the test takes
a second: the runner's own work (flags, log file, run_job's exit codes and
summary line) is what is checked. tests/experiments/test_inprocess_runs.py
(slow) runs real jobs.

Breaks checked: the log opened with "w" instead of "a" (a relaunch then
erases the killed attempt's traceback) -> the first assert on the log fails;
run_job returning 1 for a NonFiniteError -> the exit-code assert fails.
"""
import jax
import pytest

from mtrl_jax import inprocess
from mtrl_jax.train import run as run_lib
from mtrl_jax.train.learner import NonFiniteError


class _Run:
  """Attempt 1 dies mid-run, attempt 2 finishes, attempt 3 meets a non-finite loss."""
  attempts = 0

  def __init__(self, c, workdir):
    self.c = c

  def run(self):
    _Run.attempts += 1
    if _Run.attempts == 1:
      raise RuntimeError("killed in update 2 (attempt 1)")
    if _Run.attempts == 3:
      raise NonFiniteError("3 updates in a row had a non-finite loss")
    return {"final/eval/success": 0.75, "note": "text is left out of the summary line"}


@pytest.fixture
def argv(tmp_path, monkeypatch):
  monkeypatch.setattr(run_lib, "Run", _Run)
  _Run.attempts = 0
  # The job sets the persistent compile cache: keep this process's (tests/conftest.py).
  cache = jax.config.jax_compilation_cache_dir or ""
  return ["--config=configs/default.py:runlocal=true", f"--config.compile_cache={cache}",
          f"--workdir={tmp_path / 'run'}"]


def test_a_relaunch_appends_to_the_log_and_keeps_the_killed_attempts_traceback(argv, tmp_path):
  log = tmp_path / "run" / "log.txt"
  rc1, _ = inprocess.run_argv(argv, log_path=str(log))
  rc2, _ = inprocess.run_argv(argv, log_path=str(log))
  text = log.read_text()
  assert "RuntimeError: killed in update 2 (attempt 1)" in text and "Traceback" in text
  assert (rc1, rc2) == (1, 0)
  assert text.count("in-process: --config=configs/default.py") == 2
  assert text.rstrip().endswith('{"final/eval/success": 0.75}')  # the summary line: numbers only


def test_exit_codes_are_mains(argv):
  assert inprocess.run_argv(argv)[0] == 1
  assert inprocess.run_argv(argv)[0] == 0
  assert inprocess.run_argv(argv)[0] == 3  # a non-finite loss
  assert inprocess.run_argv(["--workdir=/tmp/x"])[0] == 1  # no --config: refused before any run
