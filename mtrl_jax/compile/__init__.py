"""Compiling: each program compiled once per process, and once per machine.

A program is what `jax.jit` makes of a function for one set of argument shapes.
Getting one to run costs tracing (Python to a jaxpr), lowering (to MLIR) and
the backend's compile; on a CPU most of a short run is that (issue 33).

- Once per process (`programs.py`): every jitted step, sampler and init is
  built through `shared(spec)`, where the spec is a frozen dataclass holding
  everything the builder reads. Equal specs get the same jitted object back,
  with every program it compiled: a second run in the process (another seed,
  an arm that changes no program) traces and compiles nothing. The spec is the
  key, so nothing the builder reads can be left out of it.
- Once per machine (`cache.py`): JAX's persistent compilation cache, set up by
  the job (mtrl_jax/job.py) from config.compile_cache before anything
  compiles. A new process still traces and lowers, but loads the backend's
  result from disk instead of compiling it.
- Counting (`counts.py`): how many programs the process asked the backend for,
  how many came from the persistent cache, and the seconds; a run logs each
  stage's share (`Laps`) and the whole run's in its summary.
"""
