"""Compile seconds of a jitted forward+backward, blocks scanned vs unrolled.

    python benchmarks/scan_compile.py [--layers 24] [--dim 256] [--remat none]

Builds the model abstractly (no weights are materialised), lowers and
compiles `jax.grad` of a next-token loss for each layout, and times lowering
and compilation separately (each in a fresh jit, so nothing is cached). Also
times one cached decode step of each layout, since the scanned KV cache is one
stacked array that the scan reads and writes row by row. Prints a table and,
last, one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer, token_logprobs


def compile_seconds(cfg: ModelConfig, batch: int, length: int) -> dict:
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params, tok):
    logits, _ = nnx.merge(graphdef, params)(tok[:, :-1])
    return -jnp.mean(token_logprobs(logits, tok[:, 1:]))

  tok = jax.ShapeDtypeStruct((batch, length + 1), jnp.int32)
  fn = jax.jit(jax.value_and_grad(loss))
  t0 = time.perf_counter()
  lowered = fn.lower(params, tok)
  t1 = time.perf_counter()
  lowered.compile()
  t2 = time.perf_counter()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0}


def decode_step_ms(cfg: ModelConfig, batch: int, slots: int, reps: int = 20) -> float:
  """Median ms of one jitted T=1 cached step (cache donated, as the sampler does)."""
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)

  step = jax.jit(lambda p, c, t: nnx.merge(graphdef, p)(t, c), donate_argnums=1)
  cache = model.init_cache(batch, slots)
  tok = jnp.zeros((batch, 1), jnp.int32)
  _, cache = step(params, cache, tok)  # compile
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    logits, cache = step(params, cache, tok)
    logits.block_until_ready()
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--layers", type=int, default=24)
  p.add_argument("--dim", type=int, default=256)
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--remat", default="none")
  p.add_argument("--decode_slots", type=int, default=256)
  p.add_argument("--skip_decode", action="store_true")
  args = p.parse_args()
  base = ModelConfig(vocab_size=264, dim=args.dim, n_layers=args.layers, n_heads=4, n_kv_heads=2,
                     head_dim=args.dim // 4, mlp_dim=int(args.dim * 2.75), remat=args.remat)
  rows = {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    cfg = dataclasses.replace(base, scan_layers=scan)
    rows[name] = compile_seconds(cfg, args.batch, args.length)
    if not args.skip_decode:
      rows[name]["decode_step_ms"] = decode_step_ms(cfg, args.batch, args.decode_slots)
  print(f"{args.layers} layers, dim {args.dim}, batch {args.batch} x {args.length} tokens, "
        f"remat={args.remat}, backend {jax.default_backend()}")
  for name, r in rows.items():
    dec = f"  decode step {r['decode_step_ms']:.2f} ms" if "decode_step_ms" in r else ""
    print(f"  {name:9s} lower {r['lower_s']:6.2f} s  compile {r['compile_s']:6.2f} s  "
          f"total {r['total_s']:6.2f} s{dec}")
  print(json.dumps({"layers": args.layers, "dim": args.dim, "remat": args.remat,
                    "backend": jax.default_backend(), **rows}))


if __name__ == "__main__":
  main()
