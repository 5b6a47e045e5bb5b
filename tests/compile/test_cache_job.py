"""mtrl_jax/compile/cache.py and counts.py: the persistent compilation cache a job sets up, and the compile counts it logs.

The cache is per process, so every check runs in fresh subprocesses (this test process keeps
tests/conftest.py's own cache untouched).
"""
import json
import os
import subprocess
import sys

import ml_collections
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtrl_jax.compile import cache as compile_cache
from mtrl_jax.compile import counts
from mtrl_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A process that compiles three small programs (one function at two shapes, one other)
# after cache.setup(argv[1]) (argv[2], if given: a second setup before the last
# program), and prints what it counted.
_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from mtrl_jax.compile import cache as cc, counts
path = cc.setup(sys.argv[1])
before = counts.compile_counts()
f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
f(np.ones(3, np.float32)).block_until_ready()  # numpy inputs: no jnp.ones programs
f(np.ones(5, np.float32)).block_until_ready()
f(np.ones(5, np.float32)).block_until_ready()  # the same program again: no compile at all
if len(sys.argv) > 2:
  path = cc.setup(sys.argv[2])
jax.jit(lambda x: jnp.cos(x) - 2.0)(np.ones(4, np.float32)).block_until_ready()
d = counts.delta(before, counts.compile_counts())
print(json.dumps({"path": path, "programs": d.programs, "compiled": d.compiled, "hits": d.cache_hits,
                  "writes": d.cache_writes, "backend_s": d.backend_s}))
"""


def _counts(*args, env_extra=None):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # one device, as a job runs; LLVM level as the suite
  env.update(JAX_PLATFORMS="cpu", **(env_extra or {}))
  out = subprocess.run([sys.executable, "-c", _SCRIPT, *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=240)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def _files(folder):
  return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_second_process_loads_every_program_and_empty_turns_it_off(tmp_path):
  """Breaks checked: setup without the min-compile-time override (JAX's 1 s default keeps these
  small programs out of the cache) -> the second process compiles 3, not 0; the hit event counted
  as a write (_on_event's table swapped) -> hits 0 in the second process; setup("") leaving the
  folder JAX_COMPILATION_CACHE_DIR set (the `!= path` update skipped for None) -> the third process
  hits the cache."""
  cache = str(tmp_path / "cache")
  first = _counts(cache)
  assert first["path"] == cache
  assert (first["programs"], first["compiled"], first["hits"], first["writes"]) == (3, 3, 0, 3)
  assert len(_files(cache)) == 3
  second = _counts(cache)
  assert (second["programs"], second["compiled"], second["hits"], second["writes"]) == (3, 0, 3, 0)
  listing = _files(cache)
  # Off even where the environment names a cache for JAX (read when jax is imported).
  off = _counts("", env_extra={"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
  assert off["path"] is None
  assert (off["programs"], off["compiled"], off["hits"], off["writes"]) == (3, 3, 0, 0)
  assert _files(cache) == listing  # nothing written


def test_auto_follows_the_environment_and_a_new_folder_takes_effect_in_the_same_process(tmp_path):
  """Breaks checked: setup() without cc.reset_cache() (JAX keeps the folder it opened at the first
  compile) -> the last program lands in `one`, `two` stays empty; resolve() ignoring
  MTRL_COMPILE_CACHE -> the path is the user cache folder, not `one`."""
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  got = _counts("auto", two, env_extra={compile_cache.ENV: one})
  assert got["path"] == two
  assert len(_files(one)) == 2 and len(_files(two)) == 1  # f at two shapes, then the cos program


def test_resolve(monkeypatch, tmp_path):
  """Break checked: default_dir() ignoring XDG_CACHE_HOME -> the first assert fails."""
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.resolve("auto") == os.path.join(str(tmp_path), "mtrl_jax", "jax")
  assert compile_cache.resolve("") is None and compile_cache.resolve(None) is None
  monkeypatch.setenv(compile_cache.ENV, "")
  assert compile_cache.resolve("auto") is None  # the tests' job subprocesses: no cache
  assert compile_cache.resolve(str(tmp_path / "x")) == str(tmp_path / "x")


_stats = st.builds(counts.CompileStats, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6),
                   st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6))


@given(_stats, _stats)
def test_delta_undoes_adding(a, b):
  """Break checked: delta subtracting the wrong way round (before - after) fails the first assert."""
  total = counts.CompileStats(*(getattr(a, f) + getattr(b, f) for f in
                                       ("programs", "cache_hits", "cache_writes", "backend_s", "trace_s", "lower_s")))
  d = counts.delta(a, total)
  assert (d.programs, d.cache_hits, d.cache_writes) == (b.programs, b.cache_hits, b.cache_writes)
  assert d.backend_s == pytest.approx(b.backend_s, abs=1e-6) and d.trace_s == pytest.approx(b.trace_s, abs=1e-6)
  assert d.compiled == b.programs - b.cache_hits
  m = d.as_metrics("compile/x/")
  assert m["compile/x/compiled"] == d.compiled and m["compile/x/seconds"] == pytest.approx(d.seconds)


def test_config_field_is_checked(tmp_path):
  """Break checked: validate() without validate_compile_cache -> no ValueError for either bad value."""
  c = config_lib.base_config()
  assert c.compile_cache == "auto"
  c.compile_cache = str(tmp_path)
  config_lib.validate_compile_cache(c)
  a_file = tmp_path / "f"
  a_file.write_text("x")
  for bad in (str(a_file), 3):
    c2 = ml_collections.ConfigDict({**c.to_dict(), "compile_cache": bad})
    with pytest.raises(ValueError, match="config.compile_cache"):
      config_lib.validate(c2)


def _stage_counts(workdir, what):
  """{stage: count} from the run's metrics.jsonl records of stage "compile" (train/run.py)."""
  from mtrl_jax.metrics import read_metrics
  out = {}
  for r in read_metrics(str(workdir)):
    if r["stage"] == "compile":
      out.update({k.split("/")[1]: v for k, v in r.items() if k.startswith("compile/") and k.endswith("/" + what)})
  return out


@pytest.mark.slow
def test_second_main_job_compiles_nothing_the_first_compiled(tmp_path):
  """The main job twice in fresh processes with one cache folder, then once with
  compile_cache='' (issue 33: "the second run compiles nothing that the first compiled (logged
  counts)"). Its stages are cut to building the run and the demos (what the model's init
  compiles): benchmarks/RESULTS.md has the whole SmolLM2 job's counts.

  Breaks checked (on a copy of the tree): the job (mtrl_jax/job.py) not calling cache.setup -> the second
  run compiles startup's 4 programs again; train/run.py never moving its baseline (each record the
  run's running total) -> the demos record repeats startup's programs."""
  sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
  from main_helpers import run_main
  cache = str(tmp_path / "cache")
  runs = {}
  for name, folder in (("first", cache), ("second", cache), ("off", "")):
    proc = run_main(str(tmp_path / name), "--config.stages=('demos',)", f"--config.compile_cache={folder}",
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs[name] = {w: _stage_counts(tmp_path / name, w) for w in ("programs", "compiled", "cache_hits")}
  first, second, off = runs["first"], runs["second"], runs["off"]
  assert first["programs"]["startup"] > 0 and first["programs"]["demos"] == 0
  assert first["compiled"] == first["programs"] and sum(first["cache_hits"].values()) == 0
  assert second["programs"] == first["programs"]  # the same programs asked for...
  assert second["compiled"] == {"startup": 0, "demos": 0}  # ...and none compiled again
  assert second["cache_hits"] == first["programs"]
  assert off["programs"] == off["compiled"] == first["programs"] and sum(off["cache_hits"].values()) == 0
