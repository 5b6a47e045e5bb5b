"""Training-path attention: forward+backward time and compiled temp memory.

    PYTHONPATH=$PWD python benchmarks/attention.py [--times 256,1024,4096] [--mems 2048,8192,32768]
        [--impls xla,blockwise] [--dtype float32]

Time: jitted grad of sum(out * cotangent) wrt q, k, v (H=4, KV=2; batch and
head_dim from the flags, default 1 and 64), best of --reps after a warm-up. Memory: `lower().compile()
.memory_analysis().temp_size_in_bytes` of the same function (nothing is run,
so the big sizes cost compile time only). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.models.attention import attention


def fwd_bwd(impl, block):
  def loss(q, k, v, ct):
    return jnp.sum(attention(q, k, v, impl=impl, block_q=block, block_kv=block).astype(jnp.float32) * ct)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def shapes(b, t, h, kv, hd, dtype):
  return (jax.ShapeDtypeStruct((b, t, h, hd), dtype), jax.ShapeDtypeStruct((b, t, kv, hd), dtype),
          jax.ShapeDtypeStruct((b, t, kv, hd), dtype), jax.ShapeDtypeStruct((b, t, h, hd), jnp.float32))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--times", default="256,1024,4096")
  ap.add_argument("--mems", default="2048,8192,32768")
  ap.add_argument("--impls", default="xla,blockwise")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--block", type=int, default=512)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--head_dim", type=int, default=64)
  a = ap.parse_args()
  b, h, kv, hd, dtype = a.batch, 4, 2, a.head_dim, jnp.dtype(a.dtype)
  impls = a.impls.split(",")
  result = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "dtype": a.dtype,
            "block": a.block, "batch": b, "head_dim": hd, "time_s": {}, "temp_bytes": {}}
  rng = np.random.default_rng(0)
  for t in [int(x) for x in a.times.split(",") if x]:
    args = [jnp.asarray(rng.standard_normal(s.shape), s.dtype) for s in shapes(b, t, h, kv, hd, dtype)]
    for impl in impls:
      f = fwd_bwd(impl, a.block)
      jax.block_until_ready(f(*args))
      best = float("inf")
      for _ in range(a.reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
      result["time_s"][f"{impl}@{t}"] = best
      print(f"fwd+bwd  T={t:6d}  {impl:10s} {best * 1e3:10.1f} ms", flush=True)
  for t in [int(x) for x in a.mems.split(",") if x]:
    for impl in impls:
      mem = fwd_bwd(impl, a.block).lower(*shapes(b, t, h, kv, hd, dtype)).compile().memory_analysis()
      result["temp_bytes"][f"{impl}@{t}"] = int(mem.temp_size_in_bytes)
      print(f"temp     T={t:6d}  {impl:10s} {mem.temp_size_in_bytes / 2**20:10.1f} MiB", flush=True)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
