"""JAX's persistent compilation cache and a count of what was compiled.

On a CPU most of a short run is XLA compiling (issue 33: 85% of the SmolLM2
job). JAX can keep every compiled program on disk, keyed by the program, its
devices and the compiler's version and flags, and load it in the next process
instead of compiling it again. `setup` turns that on for the process (the main
job, the study and the lab call it with config.compile_cache); `compile_counts`
counts, through `jax.monitoring`, how many programs this process asked XLA for,
how many came from the cache and how long it all took, so a run can log what
each stage compiled.

    before = compile_counts()
    ...                                # anything that compiles
    d = delta(before, compile_counts())
    d.compiled                         # programs XLA really compiled (not loaded)
"""
from __future__ import annotations

import dataclasses
import os
import threading

# config.compile_cache's default: the user cache folder (see default_dir).
AUTO = "auto"
# Where "auto" points instead of the user cache folder; set and empty, no cache.
# (The tests set it empty for the job subprocesses they launch; the study points
# its runs at one folder under its root.)
ENV = "MTRL_COMPILE_CACHE"

# jax.monitoring's event names (jax/_src/dispatch.py, compiler.py; checked on jax 0.10).
# The backend-compile duration wraps jax's compile_or_get_cached: it fires once per
# program, whether XLA compiled it or the persistent cache returned it.
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_CACHE_WRITE = "/jax/compilation_cache/cache_misses"  # fired where a missed program is written


@dataclasses.dataclass(frozen=True)
class CompileStats:
  """Totals since the process started (or, from `delta`, between two snapshots).

  programs: programs handed to the backend (XLA compiles plus persistent-cache loads).
  cache_hits: of those, loaded from the persistent cache.
  cache_writes: programs compiled and written to the cache (a miss that was stored).
  backend_s: seconds in the backend: compiling, or reading the cache.
  trace_s, lower_s: seconds tracing Python to jaxprs and lowering them to MLIR;
    the persistent cache saves neither (every process traces what it runs).
  """
  programs: int = 0
  cache_hits: int = 0
  cache_writes: int = 0
  backend_s: float = 0.0
  trace_s: float = 0.0
  lower_s: float = 0.0

  @property
  def compiled(self) -> int:
    """Programs XLA compiled (not loaded from the persistent cache)."""
    return self.programs - self.cache_hits

  @property
  def seconds(self) -> float:
    """Tracing + lowering + backend seconds: the whole cost of getting programs to run."""
    return self.backend_s + self.trace_s + self.lower_s

  def as_metrics(self, prefix: str = "compile/") -> dict:
    return {f"{prefix}programs": self.programs, f"{prefix}compiled": self.compiled,
            f"{prefix}cache_hits": self.cache_hits, f"{prefix}backend_s": self.backend_s,
            f"{prefix}trace_s": self.trace_s, f"{prefix}lower_s": self.lower_s,
            f"{prefix}seconds": self.seconds}

  def line(self) -> str:
    """One console line: '12 programs (3 compiled, 9 from the cache), 4.1 s (backend 2.0 s)'."""
    return (f"{self.programs} programs ({self.compiled} compiled, {self.cache_hits} from the cache), "
            f"{self.seconds:.1f} s (backend {self.backend_s:.1f} s)")


def delta(before: CompileStats, after: CompileStats) -> CompileStats:
  """What happened between two snapshots."""
  return CompileStats(*(getattr(after, f.name) - getattr(before, f.name)
                        for f in dataclasses.fields(CompileStats)))


_lock = threading.Lock()
_totals = {f.name: f.default for f in dataclasses.fields(CompileStats)}
_registered = False


def _on_event(event: str, **_) -> None:
  key = {_CACHE_HIT: "cache_hits", _CACHE_WRITE: "cache_writes"}.get(event)
  if key:
    with _lock:
      _totals[key] += 1


def _on_duration(event: str, duration: float, **_) -> None:
  key = {_BACKEND_COMPILE: "backend_s", _TRACE: "trace_s", _LOWER: "lower_s"}.get(event)
  if key:
    with _lock:
      _totals[key] += duration
      if event == _BACKEND_COMPILE:
        _totals["programs"] += 1


def _register() -> None:
  """The listeners, once per process (jax.monitoring keeps them for the process's life)."""
  global _registered
  with _lock:
    if _registered:
      return
    _registered = True
  import jax
  jax.monitoring.register_event_listener(_on_event)
  jax.monitoring.register_event_duration_secs_listener(_on_duration)


def compile_counts() -> CompileStats:
  """A snapshot of this process's totals (counting starts at the first call of this or `setup`)."""
  _register()
  with _lock:
    return CompileStats(**_totals)


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
  _register()
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
