"""Memory, compile time and throughput of the RL update at a real model shape.

The measured program is the learner's one jitted RL update
(`mtrl_jax.train.rl_step.make_rl_step`): a Qwen2.5-0.5B-shaped policy and a
separate critic of the same shape, decoupled PPO, AdamW on both, batch 1 per
device, one session of T tokens per row.

    python benchmarks/learner.py                 # CPU: compiled memory report, fsdp=8, compile times
    python benchmarks/learner.py --quick         # smaller: T in {2k, 8k}, 4 layers for the compile times
    python benchmarks/learner.py --run           # on a GPU/TPU: also tokens/s, MFU at T=8k, largest T
    python benchmarks/learner.py --run --skip-cpu-report --remat-sweep full,dots,dots_no_batch,none
                                                 # on a GPU/TPU: tokens/s and MFU at T=8k per remat policy

(a) Without running anything, `jit(...).lower(...).compile().memory_analysis()`
gives the compiled program's argument and temporary bytes on one device, for
T in {2k, 8k, 32k}, and the per-device argument bytes with fsdp=8 (8 fake CPU
devices, in a child process: fake devices slow everything else down). The
CPU compiler does not rematerialise by itself, so its temporaries bound what
an accelerator needs from above. Compile seconds of the 24-layer update with
and without scan over layers.
(b) With `--run` on an accelerator: tokens/s and model-FLOP utilisation of
the update at T=8k, then the largest T (doubling from 8k) whose update runs.

A table, then (last line) one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time

GIB = 1024 ** 3

# Qwen2.5-0.5B: 24 layers, d=896, 14 heads / 2 kv heads of 64, SwiGLU 4864, tied embeddings.
QWEN05B = dict(vocab_size=151_936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64,
               mlp_dim=4864, rope_theta=1_000_000.0, norm_eps=1e-6, qkv_bias=True, tie_embeddings=True,
               dtype="bfloat16", param_dtype="float32")
# The long-session switches (issue 10): flash-style attention, per-block remat,
# scanned layers, chunked vocabulary.
LONG = dict(attention="auto", remat="full", scan_layers=True, logits_chunk=1024)
# Dense bf16 peak of the chips we know, FLOP/s.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v5p": 459e12, "TPU v5e": 197e12,
             "TPU v4": 275e12}


def model_config(**over):
  from mtrl_jax.models.config import ModelConfig
  return ModelConfig(**{**QWEN05B, **LONG, **over})


def switches(cfg) -> dict:
  """The long-session switches of a model config, as recorded in the output."""
  return {k: getattr(cfg, k) for k in LONG}


def update_flops_per_token(cfg, seq_len: int) -> float:
  """Model FLOPs of one RL update per token: policy + critic, forward + backward (3x forward).

  Counts every matmul (q/k/v/o, SwiGLU, the policy's vocabulary projection)
  and causal attention (on average T/2 keys per query); rematerialised
  recomputation is not counted (MFU, not hardware utilisation).
  """
  d, h, kv, hd, f, v, L = (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim,
                           cfg.vocab_size, cfg.n_layers)
  per_layer = 2 * (d * h * hd * 2 + d * kv * hd * 2 + 3 * d * f) + 2 * 2 * h * hd * (seq_len / 2)
  trunk = L * per_layer
  policy_fwd = trunk + 2 * d * v
  critic_fwd = trunk + 2 * d
  return 3.0 * (policy_fwd + critic_fwd)


def build_update(cfg, mesh, rules, batch: int, seq_len: int, *, lr: float = 1e-5):
  """(jitted step, abstract state, abstract batch, abstract flags, factories) of the RL update."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from mtrl_jax.credit.losses import PolicyLossConfig
  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.models.value import Critic
  from mtrl_jax.parallel.batch import batch_sharding
  from mtrl_jax.parallel.sharded_init import abstract_model, state_shardings
  from mtrl_jax.parallel.sharded_step import opt_state_shardings, replicated
  from mtrl_jax.train import optim
  from mtrl_jax.train.rl_step import LearnerState, RLBatch, StepFlags, make_rl_step

  policy_f = lambda: Transformer(cfg, rngs=nnx.Rngs(0))  # noqa: E731
  critic_f = lambda: Critic(cfg, rngs=nnx.Rngs(1))  # noqa: E731
  p_gd, p_abs = abstract_model(policy_f, mesh, rules)
  c_gd, c_abs = abstract_model(critic_f, mesh, rules)
  tx_p = optim.adamw(lr, 1000, warmup_steps=0)
  tx_c = optim.adamw(lr, 1000, warmup_steps=0)
  p_sh, c_sh = state_shardings(p_abs, mesh, rules), state_shardings(c_abs, mesh, rules)
  op_sh = opt_state_shardings(tx_p, p_abs, p_sh, mesh)
  oc_sh = opt_state_shardings(tx_c, c_abs, c_sh, mesh)
  state_sh = LearnerState(p_sh, op_sh, c_sh, oc_sh)

  def with_sh(tree, sh):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)

  state = LearnerState(with_sh(p_abs, p_sh), with_sh(jax.eval_shape(tx_p.init, p_abs), op_sh),
                       with_sh(c_abs, c_sh), with_sh(jax.eval_shape(tx_c.init, c_abs), oc_sh))
  bsh2 = batch_sharding(mesh, rules, 2)
  bsh1 = batch_sharding(mesh, rules, 1)

  def arr(dtype, two_d=True):
    shape = (batch, seq_len) if two_d else (batch,)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=bsh2 if two_d else bsh1)

  f32, i32 = jnp.float32, jnp.int32
  abs_batch = RLBatch(tokens_bt=arr(i32), targets_bt=arr(i32), positions_bt=arr(i32),
                      loss_mask_bt=arr(f32), behav_logp_bt=arr(f32), prox_logp_bt=arr(f32),
                      ref_logp_bt=arr(f32), adv_bt=arr(f32), value_target_bt=arr(f32),
                      old_value_bt=arr(f32), turn_idx_bt=arr(i32), success_bt=arr(f32))
  rep = replicated(mesh)
  flags = StepFlags(*(jax.ShapeDtypeStruct((), f32, sharding=rep) for _ in range(3)))
  loss_cfg = PolicyLossConfig(agg="token_mean", behav_cap=5.0, max_turns=16)
  step = make_rl_step(p_gd, c_gd, tx_p, tx_c, loss_cfg, value_coef=0.5, value_clip=0.2, decoupled=True)
  jitted = jax.jit(step, in_shardings=(state_sh, None, rep), out_shardings=(state_sh, rep),
                   donate_argnums=(0,))
  return jitted, state, abs_batch, flags, (policy_f, critic_f, tx_p, tx_c, state_sh)


def compile_report(cfg, mesh_shape, seq_len: int, batch_per_device: int = 1) -> dict:
  """Compiles the update (no execution) and reads its memory analysis."""
  import jax

  from mtrl_jax.parallel.mesh import make_mesh
  from mtrl_jax.parallel.rules import get_rules
  from mtrl_jax.parallel.sharded_step import sharding_context
  mesh = make_mesh(mesh_shape)
  rules = get_rules("fsdp" if mesh_shape[1] > 1 else "default")
  n = int(mesh.devices.size)
  jitted, state, batch, flags, _ = build_update(cfg, mesh, rules, batch_per_device * n, seq_len)
  t0 = time.perf_counter()
  with sharding_context(mesh, rules):
    lowered = jitted.lower(state, batch, flags)
  compiled = lowered.compile()
  secs = time.perf_counter() - t0
  m = compiled.memory_analysis()
  args, temp, out = m.argument_size_in_bytes, m.temp_size_in_bytes, m.output_size_in_bytes
  del jax
  return {"seq_len": seq_len, "devices": n, "args_gib": args / GIB, "temp_gib": temp / GIB,
          "out_gib": out / GIB, "peak_gib": (args + temp) / GIB, "compile_s": secs}


def fsdp_child(seq_len: int, layers: int) -> dict:
  """Runs `compile_report` on 8 fake CPU devices with fsdp=8, in a fresh process."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, __file__, "--child-fsdp", str(seq_len), "--layers", str(layers)]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"fsdp child failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def run_on_device(cfg, seq_len: int, steps: int = 5) -> dict:
  """Executes the update on the local accelerator: seconds per step, tokens/s, MFU."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from mtrl_jax.parallel.mesh import make_mesh
  from mtrl_jax.parallel.rules import get_rules
  from mtrl_jax.parallel.sharded_init import create_sharded
  from mtrl_jax.parallel.sharded_step import init_opt_state, sharding_context
  from mtrl_jax.train.rl_step import LearnerState, RLBatch, StepFlags
  mesh = make_mesh((-1, 1, 1), devices=jax.devices()[:1])
  rules = get_rules("default")
  jitted, _, abs_batch, _, (policy_f, critic_f, tx_p, tx_c, state_sh) = build_update(
      cfg, mesh, rules, 1, seq_len)
  p = nnx.split(create_sharded(policy_f, mesh, rules))[1]
  c = nnx.split(create_sharded(critic_f, mesh, rules))[1]
  state = LearnerState(p, init_opt_state(tx_p, p, state_sh.opt_policy), c,
                       init_opt_state(tx_c, c, state_sh.opt_critic))
  rng = np.random.default_rng(0)
  tok = rng.integers(0, cfg.vocab_size, (1, seq_len + 1)).astype(np.int32)
  mask = np.zeros((1, seq_len), np.float32)
  mask[:, seq_len // 4:] = 1.0  # the first quarter is prompt/observation
  logp = np.log(rng.uniform(0.05, 1.0, (1, seq_len))).astype(np.float32)
  f = np.float32
  batch = RLBatch(tokens_bt=tok[:, :-1], targets_bt=tok[:, 1:],
                  positions_bt=np.arange(seq_len, dtype=np.int32)[None], loss_mask_bt=mask,
                  behav_logp_bt=logp, prox_logp_bt=logp + f(0.01), ref_logp_bt=logp,
                  adv_bt=rng.normal(size=(1, seq_len)).astype(f), value_target_bt=np.ones((1, seq_len), f),
                  old_value_bt=np.zeros((1, seq_len), f),
                  turn_idx_bt=(np.arange(seq_len, dtype=np.int32) // 512)[None] % 16,
                  success_bt=np.ones((1, seq_len), f))
  batch = jax.tree.map(jnp.asarray, batch)
  flags = StepFlags(jnp.float32(1), jnp.float32(1), jnp.float32(0))
  with sharding_context(mesh, rules):
    t0 = time.perf_counter()
    state, met = jitted(state, batch, flags)
    jax.block_until_ready(met)
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
      t0 = time.perf_counter()
      state, met = jitted(state, batch, flags)
      jax.block_until_ready(met)
      times.append(time.perf_counter() - t0)
  sec = float(np.median(times))
  tok_s = seq_len / sec
  kind = jax.devices()[0].device_kind
  peak = next((v for k, v in PEAK_BF16.items() if k in kind), None)
  flops = update_flops_per_token(cfg, seq_len) * seq_len
  return {"seq_len": seq_len, "step_s": sec, "first_call_s": first, "tok_s": tok_s,
          "tflops": flops / sec / 1e12, "mfu": (flops / sec / peak) if peak else None,
          "loss_finite": bool(np.isfinite(float(met["total_loss"]))), "device": kind}


def max_fitting_seq(cfg, start: int, limit: int) -> tuple[int, list]:
  """Doubles T from `start` until the update fails to compile or run (out of memory)."""
  best, tried, t = 0, [], start
  while t <= limit:
    try:
      r = run_on_device(cfg, t, steps=1)
      tried.append({"seq_len": t, "ok": True, "step_s": r["step_s"], "tok_s": r["tok_s"]})
      best = t
      print(f"  T={t}: runs, {r['step_s']:.2f} s per update, {r['tok_s']:.0f} tok/s, "
            f"MFU {r['mfu']}", flush=True)
    except Exception as e:  # XlaRuntimeError RESOURCE_EXHAUSTED and friends
      tried.append({"seq_len": t, "ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"})
      print(f"  T={t}: fails ({tried[-1]['error']})", flush=True)
      break
    t *= 2
  return best, tried


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="T in {2k, 8k}; compile times at 4 layers")
  ap.add_argument("--run", action="store_true", help="also execute on the accelerator (tokens/s, MFU, max T)")
  ap.add_argument("--layers", type=int, default=24)
  ap.add_argument("--seqs", default="", help="comma-separated T for the memory report")
  ap.add_argument("--skip-cpu-report", action="store_true", help="with --run: only the device part")
  ap.add_argument("--max-t", type=int, default=262_144, help="with --run: stop the search here")
  ap.add_argument("--remat", default=LONG["remat"], help="with --run: the remat policy of the measured update")
  ap.add_argument("--remat-sweep", default="",
                  help="with --run: comma-separated remat policies; measure each at --sweep-t instead of the "
                       "max-T search (a policy that runs out of memory is recorded as such)")
  ap.add_argument("--sweep-t", type=int, default=8192, help="with --remat-sweep: the session length")
  ap.add_argument("--child-fsdp", type=int, default=0, help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  from mtrl_jax.models.config import REMAT_POLICIES
  for name in [a.remat] + [x for x in a.remat_sweep.split(",") if x]:
    if name not in REMAT_POLICIES:
      ap.error(f"remat policy {name!r}: choose from {list(REMAT_POLICIES)}")

  if a.child_fsdp:
    r = compile_report(model_config(n_layers=a.layers), (1, 8, 1), a.child_fsdp)
    print(json.dumps(r))
    return

  import jax
  seqs = [int(s) for s in a.seqs.split(",")] if a.seqs else ([2048, 8192] if a.quick else [2048, 8192, 32768])
  out: dict = {"date": datetime.date.today().isoformat(), "host": platform.processor() or platform.machine(),
               "backend": jax.default_backend(), "layers": a.layers}
  rows = []
  if not a.skip_cpu_report:
    print(f"compiling the RL update (policy + critic, Qwen2.5-0.5B shape, {a.layers} layers) ...", flush=True)
    for t in seqs:
      r = compile_report(model_config(n_layers=a.layers), (1, 1, 1), t)
      rows.append(("1 device", r))
      print(f"  T={t:>6}: args {r['args_gib']:.2f} GiB, temp {r['temp_gib']:.2f} GiB "
            f"({r['compile_s']:.0f} s to compile)", flush=True)
      tag = f"t{t // 1024}k" if t % 1024 == 0 else f"t{t}"
      out[f"rl_peak_gib_{tag}"] = round(r["peak_gib"], 3)
      out[f"rl_temp_gib_{tag}"] = round(r["temp_gib"], 3)
    base = rows[0][1]
    f8 = fsdp_child(seqs[0], a.layers)
    rows.append(("fsdp=8", f8))
    out["fsdp8_args_ratio"] = round(f8["args_gib"] / base["args_gib"], 4)
    print(f"  fsdp=8, T={seqs[0]}: per-device args {f8['args_gib']:.2f} GiB "
          f"({out['fsdp8_args_ratio']:.3f} of one device)", flush=True)
    cl = 4 if a.quick else a.layers
    t_c = seqs[0]
    s_scan = compile_report(model_config(n_layers=cl, scan_layers=True), (1, 1, 1), t_c)["compile_s"]
    s_unr = compile_report(model_config(n_layers=cl, scan_layers=False), (1, 1, 1), t_c)["compile_s"]
    out.update(compile_layers=cl, compile_s_scan=round(s_scan, 1), compile_s_unrolled=round(s_unr, 1))
    if "rl_peak_gib_t8k" in out and "rl_peak_gib_t32k" in out:
      out["peak_ratio_32k_over_8k"] = round(out["rl_peak_gib_t32k"] / out["rl_peak_gib_t8k"], 3)
  if a.run and a.remat_sweep:
    sweep = {}
    for name in a.remat_sweep.split(","):
      try:
        r = run_on_device(model_config(n_layers=a.layers, remat=name), a.sweep_t)
        sweep[name] = {k: r[k] for k in ("step_s", "tok_s", "tflops", "mfu", "first_call_s", "loss_finite")}
        out["device"] = r["device"]
        print(f"  remat={name}: T={a.sweep_t} {r['step_s']:.3f} s per update, {r['tok_s']:.0f} tok/s, "
              f"{r['tflops']:.0f} TFLOP/s, MFU {r['mfu']}", flush=True)
      except Exception as e:  # out of memory, most likely
        sweep[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"  remat={name}: fails ({sweep[name]['error']})", flush=True)
    out.update(sweep_t=a.sweep_t, remat_sweep=sweep)
    print("\n| remat | s per update | tokens/s | TFLOP/s | MFU |\n|---|---:|---:|---:|---:|")
    for name, r in sweep.items():
      if "error" in r:
        print(f"| {name} | fails | | | |")
      else:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        print(f"| {name} | {r['step_s']:.3f} | {r['tok_s']:.0f} | {r['tflops']:.0f} | {mfu} |")
  elif a.run:
    cfg = model_config(n_layers=a.layers, remat=a.remat)
    r = run_on_device(cfg, 8192)
    out.update(device=r["device"], rl_tok_s_t8k=round(r["tok_s"], 1), rl_step_s_t8k=round(r["step_s"], 4),
               rl_tflops_t8k=round(r["tflops"], 1),
               rl_mfu_t8k=None if r["mfu"] is None else round(r["mfu"], 4))
    print(f"  on {r['device']}: T=8192 {r['tok_s']:.0f} tok/s, {r['tflops']:.0f} TFLOP/s, "
          f"MFU {out['rl_mfu_t8k']}", flush=True)
    best, tried = max_fitting_seq(cfg, 16384, a.max_t)
    out.update(max_t_fit=best, max_t_tried=tried)

  print()
  print("| measure | value |")
  print("|---|---:|")
  for k, v in out.items():
    if not isinstance(v, (list, dict)):
      print(f"| {k} | {v} |")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
