"""Mutation testing of mtrl_jax/credit/ against tests/credit/ (docs/mutation.md).

    python benchmarks/mutation.py                      # every file of credit/
    python benchmarks/mutation.py segments outcome     # some files of credit/
    python benchmarks/mutation.py --max-examples 0 ... # full hypothesis counts

Run from the repository root. It drives mutmut 3 (configured in setup.cfg:
it copies mtrl_jax/ and tests/ into mutants/, mutates credit/ there and maps
each test to the functions it calls), but tests the mutants with its own
runner, which keeps one warm process instead of forking one per mutant:

* A process that has run JAX code cannot be forked (XLA's thread pools do
  not survive: the child hangs), so mutmut's own runners either start JAX
  afresh for every mutant (forkserver) or hang (fork).
* Here every mutant runs in this process, with jit off (JAX_DISABLE_JIT=1):
  each call runs the mutated Python code (no stale compiled trace can stand
  in for it), and the per-operation executables JAX compiles are shared by
  all mutants (they depend on no project code).

The mutant's tests run fastest first and stop at the first failure; a run
longer than `--timeout-factor` times the tests' clean duration (plus
`--timeout-const` seconds) counts as a timeout. Verdicts are stored where
mutmut keeps them, so `mutmut results` and `mutmut show NAME` work after.
At the end it prints the per-file counts and writes mutants/summary.json.
"""
import argparse
import contextlib
import gc
import shutil
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path


def _parse():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("files", nargs="*",
                 help="module names under mtrl_jax/credit (default: all)")
  p.add_argument("--tests", nargs="+", default=None,
                 help="test files to map and run (default: setup.cfg's, tests/credit)")
  p.add_argument("--max-examples", type=int, default=5,
                 help="cap on each property test's examples (0: no cap)")
  p.add_argument("--jit", action="store_true",
                 help="keep jit on (caches cleared before every mutant; slower)")
  p.add_argument("--fresh", action="store_true",
                 help="delete mutants/ first (needed after editing credit/: mutmut "
                 "does not re-copy a source file it copied before)")
  p.add_argument("--summary", action="store_true",
                 help="only print the counts stored in mutants/ (e.g. of a stopped run)")
  p.add_argument("--skip-clean-run", action="store_true",
                 help="skip mutmut's run of the unmutated tests (only when mutants/ "
                 "holds a stats pass, which passed, of the same code and tests)")
  p.add_argument("--timeout-factor", type=float, default=10.0)
  p.add_argument("--timeout-const", type=float, default=20.0)
  return p.parse_args()


ARGS = _parse()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if not ARGS.jit:
  os.environ["JAX_DISABLE_JIT"] = "1"
if ARGS.max_examples > 0:
  os.environ["MTRL_MUTATION_MAX_EXAMPLES"] = str(ARGS.max_examples)

# The repository root must not shadow mutants/ (mutmut also removes it).
ROOT = Path.cwd().resolve()
sys.path[:] = [p for p in sys.path
               if Path(p or ".").resolve() not in (ROOT, ROOT / "benchmarks")]

import mutmut.__main__ as mm  # noqa: E402
from mutmut.mutation.trampoline import set_mutant_under_test  # noqa: E402
from mutmut.mutation.data import SourceFileMutationData  # noqa: E402
from mutmut.runners.harness import PytestRunner  # noqa: E402
from mutmut.state import state  # noqa: E402
from mutmut.stats import status_by_exit_code  # noqa: E402
from mutmut.utils.file_utils import walk_mutatable_files  # noqa: E402
from mutmut.workers.isolation import MutantResult, MutantRunner  # noqa: E402

NO_TESTS, TIMEOUT = 33, 36


class _Timeout(BaseException):
  """Raised by the alarm; not an Exception, so no test code swallows it."""


class InProcessRunner(MutantRunner):
  """mutmut's MutantRunner interface, every mutant tested in this process."""

  def __init__(self):
    self.tests = PytestRunner()
    self.done = []

  def startup(self):
    # What the stats pass left in memory never becomes garbage: keep the
    # collector from walking it again and again during the mutants' tests.
    gc.collect()
    gc.freeze()

  def submit(self, mutant_name, tests, cpu_time_limit, estimated_time):
    del cpu_time_limit  # a wall-clock limit instead (see below)
    if not tests:
      self.done.append(MutantResult(mutant_name=mutant_name, exit_code=NO_TESTS, duration=0.0))
      return
    tests = sorted(tests, key=lambda t: state().duration_by_test.get(t, 0.0))
    limit = ARGS.timeout_const + ARGS.timeout_factor * estimated_time
    timed_out = []

    def alarm(signum, frame):
      timed_out.append(True)
      raise _Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    set_mutant_under_test(mutant_name)
    start = time.time()
    try:
      signal.setitimer(signal.ITIMER_REAL, limit)
      with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
          contextlib.redirect_stderr(null):
        code = self.tests.run_tests(mutant_name=mutant_name, tests=tests)
    except _Timeout:
      code = TIMEOUT
    except Exception:  # pytest itself broke: the mutant broke the test set-up
      code = 3
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, old)
      set_mutant_under_test("")
    if timed_out:
      code = TIMEOUT
    self.done.append(MutantResult(mutant_name=mutant_name, exit_code=code,
                                  duration=time.time() - start))

  def has_capacity(self):
    # Each verdict is handed back (and saved by mutmut) before the next mutant
    # runs, so an interrupted run keeps what it tested.
    return not self.done

  def wait_for_result(self, timeout=None):
    return self.done.pop(0)

  def pending_count(self):
    return len(self.done)

  def signal_work_complete(self):
    pass

  def shutdown(self):
    pass

  def collect_stats(self, tests):
    return self.tests.run_stats(tests=tests or [])

  def run_clean_tests(self, tests):
    if ARGS.skip_clean_run:
      return 0
    return self.tests.run_tests(mutant_name=None, tests=tests)

  def run_forced_fail(self):
    return self.tests.run_forced_fail()

  def list_all_tests(self):
    return self.tests.list_all_tests()


def summary(selected):
  per_file, survivors = {}, {}
  for path in walk_mutatable_files():
    if selected and Path(path).stem not in selected:
      continue
    data = SourceFileMutationData(path=path)
    data.load()
    counts = Counter(status_by_exit_code[c] for c in data.exit_code_by_key.values())
    per_file[str(path)] = dict(counts)
    survivors[str(path)] = sorted(k for k, c in data.exit_code_by_key.items()
                                  if status_by_exit_code[c] in ("survived", "no tests"))
  return per_file, survivors


def print_summary(wall=None):
  per_file, survivors = summary(set(ARGS.files))
  total = Counter()
  if wall is not None:
    print(f"\nwall time {wall:.0f} s; max examples per property test: "
          f"{ARGS.max_examples or 'as written'}; jit {'on' if ARGS.jit else 'off'}")
  for path, counts in per_file.items():
    total.update(counts)
    print(f"{path:40s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
  print(f"{'total':40s} " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
  for path, names in survivors.items():
    for name in names:
      print("survivor", name)
  return per_file, survivors, total


def main():
  if ARGS.summary:
    per_file, survivors, total = print_summary()
    print(json.dumps(dict(per_file=per_file, total=dict(total), survivors=survivors)))
    return
  if ARGS.fresh:
    shutil.rmtree("mutants", ignore_errors=True)
  # Naming the mutants makes mutmut retest them even if mutants/ holds a
  # verdict from an earlier run; its stats (test -> functions) are reused,
  # and only tests it has not seen before are mapped again.
  names = tuple(f"mtrl_jax.credit.{f}.*" for f in (ARGS.files or ["*"]))
  if ARGS.files:  # generate mutants of these files only (all of credit/ takes minutes)
    mm.config().only_mutate = [f"mtrl_jax/credit/{f}.py" for f in ARGS.files]
  if ARGS.tests:
    mm.config().pytest_add_cli_args_test_selection = list(ARGS.tests)
  # pytest's unraisable/thread-exception plugins run gc.collect() five times
  # at the end of every session: with JAX and thousands of mutated functions
  # in memory that took 0.6 s of the 0.9 s each mutant's pytest.main cost
  # (measured); pytest-benchmark runs git at start-up. None of them matters here.
  mm.config().pytest_add_cli_args += ["-p", "no:unraisableexception", "-p",
                                      "no:threadexception", "-p", "no:benchmark"]
  mm.get_mutant_runner = lambda max_workers=1: InProcessRunner()
  start = time.time()
  mm._run(names, max_children=1)
  wall = time.time() - start
  per_file, survivors, total = print_summary(wall)
  out = dict(files=ARGS.files, tests=ARGS.tests, wall_s=wall, max_examples=ARGS.max_examples, jit=ARGS.jit,
             per_file=per_file, total=dict(total), survivors=survivors)
  Path("mutants/summary.json").write_text(json.dumps(out, indent=1))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
