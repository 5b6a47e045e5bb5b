"""Mutation testing of mtrl_jax/credit/ (and the staleness queue) against their tests (docs/mutation.md).

    python benchmarks/mutation.py                          # every file of credit/
    python benchmarks/mutation.py segments outcome         # some files of credit/
    python benchmarks/mutation.py rollout/staleness_queue  # a module outside credit/
    python benchmarks/mutation.py --max-examples 0 ...     # full hypothesis counts
    python benchmarks/mutation.py ppo --only '*aggregate*' # some mutants only

A target is a module of credit/ by its bare name (`ppo`), or any module of
the package by its path below mtrl_jax/ (`rollout/staleness_queue`, with or
without `mtrl_jax/` and `.py`). Without --tests a credit/ module is tested
against tests/credit and a module outside it against the tests listed in
DEFAULT_TESTS below (an error names the target that has none).

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
* When the tests never started JAX (the staleness queue's: threads, numpy),
  each mutant instead runs in a child forked from this process
  (`--isolation fork`, chosen by `auto`): a mutant that deadlocks a thread
  is killed with its threads at the timeout, instead of leaving them
  running into the next mutant's tests.

The mutant's tests run fastest first and stop at the first failure; a run
longer than `--timeout-factor` times the tests' clean duration (plus
`--timeout-const` seconds) counts as a timeout; every timed-out mutant is
then tested once more with `--recheck-factor` times that limit, and that
second verdict stands (so a mutant slowed only by a loaded machine is not
reported as a timeout). Verdicts are stored where
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


# Tests of the targets outside credit/ (a credit/ target uses setup.cfg's, tests/credit).
DEFAULT_TESTS = {
    "rollout/staleness_queue": ["tests/rollout/test_staleness_queue.py",
                                "tests/rollout/test_staleness_queue_exact.py"],
}


def _parse():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("files", nargs="*",
                 help="targets: a credit/ module by name (ppo) or a module by its path below "
                 "mtrl_jax/ (rollout/staleness_queue); default: all of credit/")
  p.add_argument("--tests", nargs="+", default=None,
                 help="test files to map and run (default: tests/credit for credit/ targets, "
                 "DEFAULT_TESTS for the others)")
  p.add_argument("--max-examples", type=int, default=5,
                 help="cap on each property test's examples (0: no cap)")
  p.add_argument("--jit", action="store_true",
                 help="keep jit on (caches cleared before every mutant; slower)")
  p.add_argument("--isolation", choices=("auto", "inprocess", "fork"), default="auto",
                 help="where each mutant's tests run: in this process, or in a child forked from it "
                 "(only safe while this process has not started JAX); auto: fork when jax is not "
                 "imported by the time the mutants run")
  p.add_argument("--only", nargs="+", default=None, metavar="GLOB",
                 help="test only the mutants whose names match (e.g. '*retry*' or a survivor's "
                 "full name from `mutmut results`); the stats pass still maps every test")
  p.add_argument("--fresh", action="store_true",
                 help="delete mutants/ first (needed after editing a target: mutmut "
                 "does not re-copy a source file it copied before)")
  p.add_argument("--summary", action="store_true",
                 help="only print the counts stored in mutants/ (e.g. of a stopped run)")
  p.add_argument("--skip-clean-run", action="store_true",
                 help="skip mutmut's run of the unmutated tests (only when mutants/ "
                 "holds a stats pass, which passed, of the same code and tests)")
  p.add_argument("--timeout-factor", type=float, default=10.0)
  p.add_argument("--timeout-const", type=float, default=20.0)
  p.add_argument("--recheck-factor", type=float, default=4.0,
                 help="a timed-out mutant is tested again with this many times its limit; "
                 "that verdict stands (0: no recheck)")
  return p.parse_args()


def target_path(name: str) -> str:
  """'ppo' -> 'mtrl_jax/credit/ppo.py'; 'rollout/staleness_queue' (or a path) -> 'mtrl_jax/rollout/...py'."""
  t = name.strip().replace("\\", "/")
  if t.startswith("./"):
    t = t[2:]
  if t.endswith(".py"):
    t = t[:-3]
  if t.startswith("mtrl_jax/"):
    t = t[len("mtrl_jax/"):]
  if "/" not in t:
    t = f"credit/{t}"
  path = f"mtrl_jax/{t}.py"
  if not Path(path).is_file():
    raise SystemExit(f"mutation.py: target {name!r}: no file {path}")
  return path


def default_tests(paths):
  """The test files of the targets: tests/credit for credit/, DEFAULT_TESTS for the others."""
  tests, missing = [], []
  for path in paths:
    key = path[len("mtrl_jax/"):-len(".py")]
    if key.startswith("credit/"):
      extra = ["tests/credit"]
    elif key in DEFAULT_TESTS:
      extra = DEFAULT_TESTS[key]
    else:
      missing.append(key)
      continue
    tests += [t for t in extra if t not in tests]
  if missing:
    raise SystemExit(f"mutation.py: no default tests for {missing}; name them with --tests "
                     f"(or add them to DEFAULT_TESTS)")
  return tests


ARGS = _parse()
TARGETS = [target_path(f) for f in ARGS.files]  # [] = all of credit/
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


def _die_with_parent():
  """Linux: the child gets SIGKILL when the runner dies (a stopped run leaves no orphan)."""
  with contextlib.suppress(Exception):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class InProcessRunner(MutantRunner):
  """mutmut's MutantRunner interface; every mutant tested in this process or a child forked from it."""

  def __init__(self):
    self.tests = PytestRunner()
    self.done = []
    self.fork = False
    self.rechecked = []  # (mutant, first limit, verdict of the recheck)

  def startup(self):
    # Called after the stats pass and the clean run. Fork only if they left
    # JAX unstarted: XLA's thread pools do not survive a fork.
    jax_loaded = "jax" in sys.modules
    if ARGS.isolation == "fork" and jax_loaded:
      raise SystemExit("mutation.py: --isolation fork, but the tests imported jax (a forked "
                       "child of a process that ran JAX hangs); use --isolation inprocess")
    self.fork = ARGS.isolation == "fork" or (ARGS.isolation == "auto" and not jax_loaded)
    print(f"isolation: {'a forked child per mutant' if self.fork else 'in process'}"
          f" (jax {'imported' if jax_loaded else 'not imported'})", flush=True)
    # What the stats pass left in memory never becomes garbage: keep the
    # collector from walking it again and again during the mutants' tests.
    gc.collect()
    gc.freeze()

  def _in_process(self, mutant_name, tests, limit):
    timed_out = []

    def alarm(signum, frame):
      timed_out.append(True)
      raise _Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    set_mutant_under_test(mutant_name)
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
    return TIMEOUT if timed_out else code

  def _forked(self, mutant_name, tests, limit):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so the timeout kills it whole
      code = 3
      try:
        os.setpgid(0, 0)
        _die_with_parent()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        set_mutant_under_test(mutant_name)
        code = self.tests.run_tests(mutant_name=mutant_name, tests=tests)
      except BaseException:  # pytest itself broke: the mutant broke the test set-up
        code = 3
      finally:
        os._exit(code if 0 <= code < 256 else 3)
    deadline = time.monotonic() + limit
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        code = os.waitstatus_to_exitcode(status)
        return code if code >= 0 else 3  # died of a signal (not ours): the mutant broke it
      if time.monotonic() > deadline:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return TIMEOUT
      time.sleep(0.005)

  def _test(self, mutant_name, tests, limit):
    run = self._forked if self.fork else self._in_process
    return run(mutant_name, tests, limit)

  def submit(self, mutant_name, tests, cpu_time_limit, estimated_time):
    del cpu_time_limit  # a wall-clock limit instead (see below)
    if not tests:
      self.done.append(MutantResult(mutant_name=mutant_name, exit_code=NO_TESTS, duration=0.0))
      return
    tests = sorted(tests, key=lambda t: state().duration_by_test.get(t, 0.0))
    limit = ARGS.timeout_const + ARGS.timeout_factor * estimated_time
    start = time.time()
    code = self._test(mutant_name, tests, limit)
    if code == TIMEOUT and ARGS.recheck_factor > 0:
      # A loaded machine can stretch a run past its limit: a timeout stands
      # only if the mutant also runs past a limit several times longer.
      code = self._test(mutant_name, tests, ARGS.recheck_factor * limit)
      self.rechecked.append((mutant_name, limit, status_by_exit_code[code]))
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
    if selected and str(path) not in selected:
      continue
    data = SourceFileMutationData(path=path)
    data.load()
    if not selected and not data.exit_code_by_key:
      continue  # --summary of everything: the files this mutants/ tested
    counts = Counter(status_by_exit_code[c] for c in data.exit_code_by_key.values())
    per_file[str(path)] = dict(counts)
    survivors[str(path)] = sorted(k for k, c in data.exit_code_by_key.items()
                                  if status_by_exit_code[c] in ("survived", "no tests"))
  return per_file, survivors


def print_summary(wall=None):
  per_file, survivors = summary(set(TARGETS))
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
  paths = TARGETS or ["mtrl_jax/credit/*"]
  names = tuple(p[:-len(".py")].replace("/", ".") + ".*" if p.endswith(".py")
                else "mtrl_jax.credit.*" for p in paths)
  if ARGS.only:
    names = tuple(ARGS.only)
  # Generate mutants of the targets only (all of credit/ takes minutes;
  # setup.cfg also lists the modules outside credit/ for `mutmut show`).
  mm.config().only_mutate = list(paths)
  tests = ARGS.tests or (default_tests(TARGETS) if TARGETS else None)
  if tests:
    mm.config().pytest_add_cli_args_test_selection = list(tests)
  # pytest's unraisable/thread-exception plugins run gc.collect() five times
  # at the end of every session: with JAX and thousands of mutated functions
  # in memory that took 0.6 s of the 0.9 s each mutant's pytest.main cost
  # (measured); pytest-benchmark runs git at start-up. None of them matters here.
  mm.config().pytest_add_cli_args += ["-p", "no:unraisableexception", "-p",
                                      "no:threadexception", "-p", "no:benchmark"]
  runner = InProcessRunner()
  mm.get_mutant_runner = lambda max_workers=1: runner
  start = time.time()
  mm._run(names, max_children=1)
  wall = time.time() - start
  for name, limit, verdict in runner.rechecked:
    print(f"timeout at {limit:.0f} s rechecked with {ARGS.recheck_factor:g}x: {verdict}  {name}")
  per_file, survivors, total = print_summary(wall)
  out = dict(files=ARGS.files, tests=tests, wall_s=wall, max_examples=ARGS.max_examples, jit=ARGS.jit,
             isolation="fork" if runner.fork else "inprocess",
             rechecked_timeouts=[dict(mutant=n, limit_s=l, verdict=v) for n, l, v in runner.rechecked],
             per_file=per_file, total=dict(total), survivors=survivors)
  Path("mutants/summary.json").write_text(json.dumps(out, indent=1))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
