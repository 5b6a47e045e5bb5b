"""Runs main-job argvs one after another in this process (mtrl_jax/inprocess.py), for the tests.

  python -m tests.experiments.inprocess_worker '{"jobs": [[...argv...], ...], "fail": {"job": 2, "update": 2}}'

Prints one JSON line per job: its exit code and what it compiled (mtrl_jax/compile/counts.py).
With "fail", job `job` raises inside its `update`-th learner update (1-based): an
interrupted run, whose checkpoint the next job with the same workdir resumes from.
"""
import json
import os
import sys

from mtrl_jax import inprocess
from mtrl_jax.compile import counts
from mtrl_jax.train import learner as learner_lib


class Interrupted(RuntimeError):
  pass


def main():
  spec = json.loads(sys.argv[1])
  fail = spec.get("fail") or {}
  real_update = learner_lib.Learner.update
  for i, argv in enumerate(spec["jobs"]):
    calls = [0]

    def update(self, *a, _calls=calls, _fail=fail.get("update") if fail.get("job") == i else None, **kw):
      _calls[0] += 1
      if _fail is not None and _calls[0] == _fail:
        raise Interrupted(f"interrupted at update {_calls[0]}")
      return real_update(self, *a, **kw)

    learner_lib.Learner.update = update
    before = counts.compile_counts()
    workdir = argv[-1].split("=", 1)[1]
    rc, secs = inprocess.run_argv(argv, log_path=os.path.join(workdir, "log.txt"))
    d = counts.delta(before, counts.compile_counts())
    print(json.dumps({"job": i, "rc": rc, "secs": secs, "programs": d.programs, "compiled": d.compiled,
                      "cache_hits": d.cache_hits}), flush=True)
  learner_lib.Learner.update = real_update


if __name__ == "__main__":
  main()
