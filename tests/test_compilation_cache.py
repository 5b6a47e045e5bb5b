"""tests/conftest.py: the test processes compile through JAX's persistent cache; the job
subprocesses tests launch do not inherit it (a 2-process jax.distributed test timed out with it)."""
import os
import subprocess
import sys

import jax
import pytest


@pytest.mark.skipif(os.environ.get("MTRL_TEST_JAX_CACHE") == "0", reason="cache turned off (MTRL_TEST_JAX_CACHE=0)")
def test_this_process_caches_and_its_subprocesses_do_not():
  """Break checked: dropping conftest's pytest_collection_finish (the child then prints the
  cache folder) fails the second assert, in one process and under xdist."""
  assert (jax.config.jax_compilation_cache_dir or "").endswith(os.path.join(".pytest_cache", "jax_compilation"))
  child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('JAX_COMPILATION_CACHE_DIR'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
  assert child == "None", child
