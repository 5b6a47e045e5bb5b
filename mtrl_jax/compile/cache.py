"""The persistent compilation cache: a program compiled once per machine.

On a CPU most of a short run is XLA compiling (issue 33: 85% of the SmolLM2
job). JAX can keep every compiled program on disk, keyed by the program, its
devices and the compiler's version and flags, and load it in the next process
instead of compiling it again. `setup` turns that on for the process
(mtrl_jax/job.py calls it with config.compile_cache before anything compiles).
"""
from __future__ import annotations

import os

from mtrl_jax.compile.counts import start_counting

# config.compile_cache's default: the user cache folder (see default_dir).
AUTO = "auto"
# Where "auto" points instead of the user cache folder; set and empty, no cache.
# (The tests set it empty for the job subprocesses they launch; the study points
# its runs at one folder under its root.)
ENV = "MTRL_COMPILE_CACHE"


def default_dir() -> str:
  """The user cache folder: $XDG_CACHE_HOME/mtrl_jax/jax, else ~/.cache/mtrl_jax/jax."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "mtrl_jax", "jax")


def resolve(cache_dir: str | None) -> str | None:
  """The folder config.compile_cache names: "auto" -> $MTRL_COMPILE_CACHE or default_dir(); ""/None -> None."""
  if cache_dir == AUTO:
    cache_dir = os.environ[ENV] if ENV in os.environ else default_dir()
  if not cache_dir:
    return None
  return os.path.abspath(os.path.expanduser(cache_dir))


def setup(cache_dir: str | None = AUTO) -> str | None:
  """Turns JAX's persistent compilation cache on in `cache_dir` (see `resolve`), or off.

  Every program is cached, however small or quick to compile: on a CPU the many
  small ones are most of the compiling (JAX's defaults skip programs compiled in
  under a second). Returns the folder in use, None when off. Starts the counters.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc
  start_counting()
  path = resolve(cache_dir)
  if path is not None:
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no minimum, no override
  if jax.config.jax_compilation_cache_dir != path:
    jax.config.update("jax_compilation_cache_dir", path)
    # JAX opens its cache once, at the first compile: a folder set later needs a fresh start.
    cc.reset_cache()
  return path


def describe(path: str | None) -> str:
  return f"compilation cache: {path}" if path else "compilation cache: off (config.compile_cache='')"
