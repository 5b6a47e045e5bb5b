"""A count of what this process compiled, through `jax.monitoring`.

How many programs this process asked XLA for, how many came from the
persistent cache and how long it all took, so a run can log what each stage
compiled.

    before = compile_counts()
    ...                                # anything that compiles
    d = delta(before, compile_counts())
    d.compiled                         # programs XLA really compiled (not loaded)

    laps = Laps()                      # per stage: each lap what happened since the last
    ...; laps.lap().compiled
"""
from __future__ import annotations

import dataclasses
import threading

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


def start_counting() -> None:
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
  start_counting()
  with _lock:
    return CompileStats(**_totals)


class Laps:
  """What was compiled between one `lap` and the next (the stages of a run), and in all.

  Each lap's counts start where the last one ended: a stage's line says what
  that stage compiled, not everything since the run began.
  """

  def __init__(self):
    self.first = self.last = compile_counts()

  def lap(self) -> CompileStats:
    """What was compiled since the last lap (or since this object was made)."""
    now = compile_counts()
    d, self.last = delta(self.last, now), now
    return d

  def total(self) -> CompileStats:
    """What was compiled from this object's making to the last lap."""
    return delta(self.first, self.last)
