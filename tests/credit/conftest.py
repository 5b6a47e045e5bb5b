"""Set-up of the credit tests when they run under mutation testing (mutmut).

mutmut sets MUTANT_UNDER_TEST in every process it runs the tests in; outside
mutmut nothing here changes anything. See docs/mutation.md.

* Hypothesis: no example database (mutants would otherwise store their
  failing examples and replay them for other mutants, so verdicts would
  depend on the order mutants ran in) and derandomised, so the same
  examples are drawn for every mutant and a rerun gives the same counts.
* MTRL_MUTATION_MAX_EXAMPLES (if set) caps every property test's example
  count, including those whose @settings name one: the mutation run tries
  thousands of mutants on a 2-core machine and cannot afford 30 examples
  per test per mutant. A mutant that only a rare example would expose can
  then survive; the normal test run keeps the full counts.
* With jit on, the stats pass (MUTANT_UNDER_TEST == 'stats') would miss
  tests: mutmut maps each test to the functions it calls by watching which
  of its trampolines run, a function body only runs while it is traced, and
  an estimator compiled by an earlier test is not traced again. So before
  each test of that pass JAX's caches are cleared. benchmarks/mutation.py
  runs with jit off, where every call runs the Python code anyway.
"""
import os

import pytest
from hypothesis import HealthCheck, Phase, settings

UNDER_MUTMUT = "MUTANT_UNDER_TEST" in os.environ
NO_SHRINK = (Phase.explicit, Phase.generate)

if UNDER_MUTMUT:
  settings.register_profile(
      "mutation", database=None, derandomize=True, deadline=None, phases=NO_SHRINK,
      suppress_health_check=list(HealthCheck))
  settings.load_profile("mutation")


def pytest_collection_modifyitems(items):
  cap = os.environ.get("MTRL_MUTATION_MAX_EXAMPLES")
  if not (UNDER_MUTMUT and cap):
    return
  for item in items:
    fn = getattr(item, "obj", None)
    old = getattr(fn, "_hypothesis_internal_use_settings", None)
    if old is not None:
      fn._hypothesis_internal_use_settings = settings(
          old, max_examples=min(old.max_examples, int(cap)), database=None,
          derandomize=True, deadline=None, phases=NO_SHRINK)


@pytest.fixture(autouse=True)
def _retrace_under_mutmut_stats():
  if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    import jax
    if not jax.config.jax_disable_jit:
      jax.clear_caches()
  yield
