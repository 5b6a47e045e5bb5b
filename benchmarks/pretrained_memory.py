"""CPU memory of the RL update with a real pretrained policy AND critic (configs/smol.py).

Builds what `python -m mtrl_jax.main --config=configs/smol.py:estimator=gae`
builds (SmolLM2-135M-Instruct policy, a separate critic with the same trunk,
AdamW on both, the recipe's runtime switches), then runs learner updates on
synthetic sessions of `--tokens` tokens each (half prefilled, half
generated), `--batch` sessions per minibatch. Each setting runs in a fresh
process so its peak resident memory (ru_maxrss) is its own.

    python benchmarks/pretrained_memory.py --hf_dir ~/.cache/mtrl_jax/SmolLM2-135M-Instruct
    python benchmarks/pretrained_memory.py --hf_dir DIR --remat full,dots --tokens 512 --batch 8

Columns: resident memory after building (params + Adam moments of both
networks), the peak over three updates, and the third update's wall time (the first two compile). A
table, then one JSON line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

GIB = 1024 ** 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_bytes() -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  return 0


def child(hf_dir: str, remat: str, tokens: int, batch: int) -> dict:
  """One setting, in this process: build the recipe's learner, two updates."""
  sys.path.insert(0, ROOT)
  import numpy as np
  from configs.smol import get_config
  from mtrl_jax.rollout.session import Session, make_turn
  from mtrl_jax.train.run import Run

  c = get_config(f"hf_dir={hf_dir},estimator=gae")
  c.stages = ()
  c.model.remat = remat
  c.rollout.context_cap = max(c.rollout.context_cap, tokens)
  c.rl.tasks_per_update, c.rl.group_size, c.rl.minibatches = batch // 2, 2, 1
  c.log.tensorboard = False
  c.checkpoint.async_save = False
  workdir = f"/tmp/mtrl_pretrained_memory_{os.getpid()}"
  t0 = time.time()
  run = Run(c, workdir)
  built_s = time.time() - t0
  rss_built = _rss_bytes()
  rng = np.random.default_rng(0)
  vocab = run.model_cfg.vocab_size

  def sessions(step):
    out = []
    for i in range(batch):
      s = Session(session_id=step * batch + i, task_id=i // 2, group_id=step * batch + i // 2, seed=i,
                  env_name="synthetic")
      half = tokens // 2
      s.turns.append(make_turn("o", rng.integers(3, vocab, half), "a", rng.integers(3, vocab, tokens - half),
                               np.full(tokens - half, -3.0), run.learner.version, float(rng.random())))
      s.finish("terminated", success=bool(i % 2))
      out.append(s)
    return out

  times = []
  for step in range(3):  # the first two compile (uncommitted, then committed state)
    t0 = time.time()
    met = run.learner.update(sessions(step), step)
    times.append(time.time() - t0)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  n_params = sum(int(x.size) for x in __import__("jax").tree.leaves(run.learner.state.policy))
  n_critic = sum(int(x.size) for x in __import__("jax").tree.leaves(run.learner.state.critic))
  return {"remat": remat, "tokens": tokens, "batch": batch, "policy_params": n_params, "critic_params": n_critic,
          "rss_built_gib": rss_built / GIB, "peak_rss_gib": peak / GIB, "build_s": built_s,
          "first_update_s": times[0], "update_s": times[-1], "seq_len": met["update/seq_len"],
          "finite": bool(met.get("update/nonfinite_steps", 1) == 0)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--hf_dir", default=os.path.expanduser("~/.cache/mtrl_jax/SmolLM2-135M-Instruct"))
  ap.add_argument("--remat", default="full,dots", help="comma-separated remat policies")
  ap.add_argument("--tokens", type=int, default=512)
  ap.add_argument("--batch", type=int, default=8, help="sessions per minibatch (one minibatch per update)")
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.child:
    print(json.dumps(child(a.hf_dir, a.child, a.tokens, a.batch)), flush=True)
    return 0
  rows = []
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  env.pop("XLA_FLAGS", None)
  for remat in a.remat.split(","):
    proc = subprocess.run([sys.executable, __file__, "--hf_dir", a.hf_dir, "--tokens", str(a.tokens), "--batch",
                           str(a.batch), "--child", remat], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
      print(proc.stderr[-3000:], file=sys.stderr)
      # A child killed by a signal leaves no traceback: say which (SIGKILL is usually the OOM killer).
      why = (f"killed by signal {-proc.returncode}" + (" (out of memory?)" if proc.returncode == -9 else "")
             if proc.returncode < 0 else f"exit {proc.returncode}")
      rows.append({"remat": remat, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else why})
      continue
    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  print(f"{'remat':8} {'tokens':>6} {'batch':>5} {'built GiB':>9} {'peak GiB':>8} {'update s':>8}")
  for r in rows:
    if "error" in r:
      print(f"{r['remat']:8} error: {r['error']}")
      continue
    print(f"{r['remat']:8} {r['tokens']:>6} {r['batch']:>5} {r['rss_built_gib']:>9.2f} {r['peak_rss_gib']:>8.2f} "
          f"{r['update_s']:>8.1f}")
  print(json.dumps({"benchmark": "pretrained_memory", "hf_dir": a.hf_dir, "machine": platform.processor() or
                    platform.machine(), "cpus": os.cpu_count(), "load": os.getloadavg()[0],
                    "date": datetime.date.today().isoformat(), "rows": rows}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
