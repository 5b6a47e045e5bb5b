"""LoRA against full fine-tuning: compiled memory of the RL update, update time, sampler modes.

    python benchmarks/lora_bench.py                 # all three parts (CPU; ~30-40 min on 2 cores)
    python benchmarks/lora_bench.py --parts memory  # one part: memory | update | sampler

(a) memory: the learner's jitted RL update (`train/rl_step.make_rl_step`,
    jitted as `train/learner.Learner` does) at the Qwen2.5-0.5B shape of
    benchmarks/learner.py (24 scanned layers, bf16 compute, fp32 weights,
    blockwise attention, remat=full, chunked log-probs), T = 8k, batch 1 per
    device, compiled and not run: `lower().compile().memory_analysis()` on
    one CPU device and, in a child process, per device with fsdp = 8 (8 fake
    CPU devices). Two programs:
      full - policy + separate critic, every weight trained (AdamW on both);
      lora - LoRA rank 16 on q/k/v/o/gate/up/down of a frozen policy, and the
             critic as rank-16 adapters + value head on that same frozen trunk
             (critic.kind="lora"): AdamW on the adapters and the head only.
(b) update: the same two programs executed on CPU at the SmolLM2-135M shape
    (30 layers, d 576, 9 / 3 heads of 64, MLP 1536, vocab 49152, tied; a
    random model of that shape, fp32), batch 2 x 256 tokens: seconds per
    update (median of 3 after a warm-up call).
(c) sampler: a LoRA rank-16 SmolLM2-shaped policy decoded by the sampler
    with the adapters applied (`lora.sampler="apply"`: the low-rank terms in
    every decode step) or merged once per published version ("merge": the
    base program on merged weights, plus the merge itself): batch 8, a
    64-token prompt, 32 greedy tokens.

A table per part, then (last line) one JSON object.
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

import numpy as np

GIB = 1024 ** 3
RANK, ALPHA = 16, 32.0
SMOL = dict(vocab_size=49_152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, mlp_dim=1536,
            rope_theta=100_000.0, norm_eps=1e-5, qkv_bias=False, tie_embeddings=True, dtype="float32",
            param_dtype="float32", scan_layers=True)


def qwen_config(**over):
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from learner import LONG, QWEN05B  # benchmarks/learner.py: the shape its RESULTS numbers use
  from mtrl_jax.models.config import ModelConfig
  return ModelConfig(**{**QWEN05B, **LONG, **over})


def smol_config(**over):
  from mtrl_jax.models.config import ModelConfig
  return ModelConfig(**{**SMOL, **over})


def with_lora(cfg):
  from mtrl_jax.models.lora import LoraConfig
  return dataclasses.replace(cfg, lora=LoraConfig(rank=RANK, alpha=ALPHA))


def build_update(cfg, mesh, rules, batch: int, seq_len: int, variant: str, *, lr: float = 1e-5):
  """(jitted step, abstract args, factories) of the RL update: variant "full" or "lora" (see module doc)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from mtrl_jax.credit.losses import PolicyLossConfig
  from mtrl_jax.models import lora
  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.models.value import SHARED_TRUNK_OWN, Critic
  from mtrl_jax.parallel.batch import batch_sharding
  from mtrl_jax.parallel.sharded_init import abstract_model, state_shardings
  from mtrl_jax.parallel.sharded_step import opt_state_shardings, replicated, split_trainable
  from mtrl_jax.train import optim
  from mtrl_jax.train.rl_step import Frozen, LearnerState, RLBatch, StepFlags, make_rl_step

  lora_on = variant == "lora"
  pcfg = with_lora(cfg) if lora_on else cfg
  policy_f = lambda: Transformer(pcfg, rngs=nnx.Rngs(0))  # noqa: E731
  critic_f = lambda: Critic(pcfg, rngs=nnx.Rngs(1))  # noqa: E731  (shared trunk: same adapters' shape)
  p_gd, p_abs = abstract_model(policy_f, mesh, rules)
  c_gd, c_abs = abstract_model(critic_f, mesh, rules)
  if lora_on:
    p_train, p_frozen = split_trainable(p_abs, lora.ADAPTER)
    c_train = nnx.split_state(c_abs, SHARED_TRUNK_OWN, ...)[0]
  else:
    p_train, p_frozen, c_train = p_abs, None, c_abs
  tx_p = optim.adamw(lr, 1000, warmup_steps=0)
  tx_c = optim.adamw(lr, 1000, warmup_steps=0)
  p_sh, c_sh = state_shardings(p_train, mesh, rules), state_shardings(c_train, mesh, rules)
  op_sh = opt_state_shardings(tx_p, p_train, p_sh, mesh)
  oc_sh = opt_state_shardings(tx_c, c_train, c_sh, mesh)
  state_sh = LearnerState(p_sh, op_sh, c_sh, oc_sh)
  frozen_sh = Frozen(state_shardings(p_frozen, mesh, rules) if lora_on else None, None)

  def with_sh(tree, sh):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)

  state = LearnerState(with_sh(p_train, p_sh), with_sh(jax.eval_shape(tx_p.init, p_train), op_sh),
                       with_sh(c_train, c_sh), with_sh(jax.eval_shape(tx_c.init, c_train), oc_sh))
  frozen = Frozen(with_sh(p_frozen, frozen_sh.policy) if lora_on else None, None)
  bsh = batch_sharding(mesh, rules, 2)

  def arr(dtype):
    return jax.ShapeDtypeStruct((batch, seq_len), dtype, sharding=bsh)

  f32, i32 = jnp.float32, jnp.int32
  abs_batch = RLBatch(tokens_bt=arr(i32), targets_bt=arr(i32), positions_bt=arr(i32), loss_mask_bt=arr(f32),
                      behav_logp_bt=arr(f32), prox_logp_bt=arr(f32), ref_logp_bt=arr(f32), adv_bt=arr(f32),
                      value_target_bt=arr(f32), old_value_bt=arr(f32), turn_idx_bt=arr(i32), success_bt=arr(f32))
  rep = replicated(mesh)
  flags = StepFlags(*(jax.ShapeDtypeStruct((), f32, sharding=rep) for _ in range(3)))
  loss_cfg = PolicyLossConfig(agg="token_mean", behav_cap=5.0, max_turns=16)
  step = make_rl_step(p_gd, c_gd, tx_p, tx_c, loss_cfg, value_coef=0.5, value_clip=0.2, decoupled=True,
                      shared_trunk=lora_on)
  jitted = jax.jit(step, in_shardings=(state_sh, None, rep, frozen_sh), out_shardings=(state_sh, rep),
                   donate_argnums=(0,))
  return jitted, (state, abs_batch, flags, frozen), (policy_f, critic_f, tx_p, tx_c, state_sh)


def tree_bytes(tree) -> int:
  import jax
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def compile_report(variant: str, mesh_shape, seq_len: int, layers: int) -> dict:
  """Compiles the update (no execution) and reads its memory analysis."""
  from mtrl_jax.parallel.mesh import make_mesh
  from mtrl_jax.parallel.rules import get_rules
  from mtrl_jax.parallel.sharded_step import sharding_context
  mesh = make_mesh(mesh_shape)
  rules = get_rules("fsdp" if mesh_shape[1] > 1 else "default")
  n = int(mesh.devices.size)
  jitted, args, _ = build_update(qwen_config(n_layers=layers), mesh, rules, n, seq_len, variant)
  state, _, _, frozen = args
  t0 = time.perf_counter()
  with sharding_context(mesh, rules):
    compiled = jitted.lower(*args).compile()
  secs = time.perf_counter() - t0
  m = compiled.memory_analysis()
  a, tmp, out = m.argument_size_in_bytes, m.temp_size_in_bytes, m.output_size_in_bytes
  return {"variant": variant, "seq_len": seq_len, "devices": n, "layers": layers,
          "args_gib": a / GIB, "temp_gib": tmp / GIB, "out_gib": out / GIB, "peak_gib": (a + tmp) / GIB,
          "trained_gib": tree_bytes((state.policy, state.critic)) / GIB,
          "opt_gib": tree_bytes((state.opt_policy, state.opt_critic)) / GIB,
          "frozen_gib": tree_bytes(frozen.policy) / GIB if frozen.policy is not None else 0.0,
          "compile_s": secs}


def child(variant: str, seq_len: int, layers: int) -> dict:
  """compile_report with fsdp = 8 on 8 fake CPU devices, in a fresh process."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, __file__, "--child", variant, "--seq", str(seq_len), "--layers", str(layers)]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"fsdp child failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def part_memory(seq_len: int, layers: int) -> dict:
  rows = []
  for variant in ("full", "lora"):
    print(f"compiling the {variant} update (Qwen2.5-0.5B shape, {layers} layers, T={seq_len}) ...", flush=True)
    rows.append(("1 device", compile_report(variant, (1, 1, 1), seq_len, layers)))
    rows.append(("fsdp=8, per device", child(variant, seq_len, layers)))
  print("\n| program | mesh | trained params (whole) | optimiser (whole) | frozen base (whole) | args | temp |"
        " peak (args+temp) |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for mesh, r in rows:
    print(f"| {r['variant']} | {mesh} | {r['trained_gib']:.3f} GiB | {r['opt_gib']:.3f} GiB | "
          f"{r['frozen_gib']:.3f} GiB | {r['args_gib']:.2f} GiB | {r['temp_gib']:.2f} GiB | "
          f"{r['peak_gib']:.2f} GiB |")
  out = {}
  for mesh, r in rows:
    key = f"{r['variant']}_{'1dev' if r['devices'] == 1 else 'fsdp8'}"
    out.update({f"{key}_peak_gib": round(r["peak_gib"], 3), f"{key}_args_gib": round(r["args_gib"], 3),
                f"{key}_temp_gib": round(r["temp_gib"], 3)})
  out["lora_over_full_peak_1dev"] = round(out["lora_1dev_peak_gib"] / out["full_1dev_peak_gib"], 3)
  out["lora_over_full_peak_fsdp8"] = round(out["lora_fsdp8_peak_gib"] / out["full_fsdp8_peak_gib"], 3)
  return out


def part_update(batch: int, seq_len: int, steps: int = 3) -> dict:
  """Seconds per executed update, full vs LoRA, at the SmolLM2-135M shape on this CPU."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from mtrl_jax.models import lora
  from mtrl_jax.models.value import SHARED_TRUNK_OWN
  from mtrl_jax.parallel.mesh import make_mesh
  from mtrl_jax.parallel.rules import get_rules
  from mtrl_jax.parallel.sharded_init import create_sharded, create_sharded_part
  from mtrl_jax.parallel.sharded_step import init_opt_state, sharding_context, split_trainable
  from mtrl_jax.train.rl_step import Frozen, LearnerState, RLBatch, StepFlags
  mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = get_rules("default")
  cfg = smol_config()
  rng = np.random.default_rng(0)
  tok = rng.integers(0, cfg.vocab_size, (batch, seq_len + 1)).astype(np.int32)
  mask = np.zeros((batch, seq_len), np.float32)
  mask[:, seq_len // 4:] = 1.0
  logp = np.log(rng.uniform(0.05, 1.0, (batch, seq_len))).astype(np.float32)
  f = np.float32
  rl_batch = jax.tree.map(jnp.asarray, RLBatch(
      tokens_bt=tok[:, :-1], targets_bt=tok[:, 1:], positions_bt=np.tile(np.arange(seq_len, dtype=np.int32),
                                                                         (batch, 1)),
      loss_mask_bt=mask, behav_logp_bt=logp, prox_logp_bt=logp + f(0.01), ref_logp_bt=logp,
      adv_bt=rng.normal(size=(batch, seq_len)).astype(f), value_target_bt=np.ones((batch, seq_len), f),
      old_value_bt=np.zeros((batch, seq_len), f), turn_idx_bt=np.zeros((batch, seq_len), np.int32),
      success_bt=np.ones((batch, seq_len), f)))
  flags = StepFlags(jnp.float32(1), jnp.float32(1), jnp.float32(0))
  built = {}
  for variant in ("full", "lora"):
    jitted, _, (policy_f, critic_f, tx_p, tx_c, state_sh) = build_update(cfg, mesh, rules, batch, seq_len, variant)
    p = nnx.split(create_sharded(policy_f, mesh, rules))[1]
    if variant == "lora":
      p_train, p_frozen = split_trainable(p, lora.ADAPTER)
      c_train = create_sharded_part(critic_f, SHARED_TRUNK_OWN, mesh, rules)[1]
    else:
      p_train, p_frozen = p, None
      c_train = nnx.split(create_sharded(critic_f, mesh, rules))[1]
    state = LearnerState(p_train, init_opt_state(tx_p, p_train, state_sh.opt_policy), c_train,
                         init_opt_state(tx_c, c_train, state_sh.opt_critic))
    built[variant] = [jitted, state, Frozen(p_frozen, None), None]
  out, rows, times = {}, [], {v: [] for v in built}
  with sharding_context(mesh, rules):
    for r in range(steps + 1):
      for variant, b in built.items():  # interleaved: a load change on the machine hits both alike
        jitted, state, frozen, _ = b
        t0 = time.perf_counter()
        state, met = jitted(state, rl_batch, flags, frozen)
        jax.block_until_ready(met)
        dt = time.perf_counter() - t0
        b[1], b[3] = state, met
        if r == 0:
          out[f"update_first_call_s_{variant}"] = round(dt, 1)
        else:
          times[variant].append(dt)
  for variant, (_, state, _, met) in built.items():
    sec = float(np.median(times[variant]))
    trained = tree_bytes((state.policy, state.critic))
    rows.append((variant, sec, out[f"update_first_call_s_{variant}"], trained,
                 bool(np.isfinite(float(met["total_loss"])))))
    out[f"update_s_{variant}"] = round(sec, 3)
    print(f"  {variant}: {sec:.2f} s per update (all: {[round(t, 2) for t in times[variant]]}), "
          f"trained {trained / 2**20:.1f} MiB", flush=True)
  print(f"\n| SmolLM2-135M shape, policy + critic, {batch} x {seq_len} tokens | s per update | first call (s) |"
        " trained params | loss finite |")
  print("|---|---:|---:|---:|---|")
  for variant, sec, first, trained, ok in rows:
    print(f"| {variant} | {sec:.2f} | {first:.1f} | {trained / 2**20:.1f} MiB | {ok} |")
  out["update_lora_speedup"] = round(out["update_s_full"] / out["update_s_lora"], 3)
  out.update(update_batch=batch, update_seq=seq_len)
  return out


def part_sampler(batch: int, prompt: int, new: int, reps: int = 3) -> dict:
  """Decode with the adapters applied vs merged once per version (plus the merge's own cost)."""
  import jax
  from flax import nnx

  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.sampling.sampler import Sampler, SamplingParams
  from mtrl_jax.train.adapters import sampler_setup
  cfg = with_lora(smol_config())
  gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, cfg.vocab_size, prompt)) for _ in range(batch)]
  out, rows, samplers, merge_s = {}, [], {}, 0.0
  for mode in ("apply", "merge"):
    sgd, _, finish = sampler_setup(dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, sampler=mode)), gd)
    sparams = params
    if finish is not None:
      fn = jax.jit(finish)
      jax.block_until_ready(fn(params))
      t = []
      for _ in range(reps):
        t0 = time.perf_counter()
        sparams = jax.block_until_ready(fn(params))
        t.append(time.perf_counter() - t0)
      merge_s = float(np.median(t))
    samplers[mode] = Sampler(sgd, sparams, pad_id=0, stop_ids=(), log_compiles=False)
  decode_t = {m: [] for m in samplers}
  prefill_t = {m: [] for m in samplers}
  for r in range(reps + 1):
    for mode, sampler in samplers.items():  # interleaved, as in part_update
      st = sampler.init_state(batch, prompt + new + 8)
      t0 = time.perf_counter()
      st = sampler.append(st, prompts)
      jax.block_until_ready(st.last_logits_bv)
      t1 = time.perf_counter()
      res, st = sampler.generate(st, jax.random.key(r), new, params=SamplingParams(greedy=True))
      t2 = time.perf_counter()
      if r:  # the first round compiles
        prefill_t[mode].append(t1 - t0)
        decode_t[mode].append(t2 - t1)
  for mode in samplers:
    dec, pre = float(np.median(decode_t[mode])), float(np.median(prefill_t[mode]))
    m = merge_s if mode == "merge" else 0.0
    rows.append((mode, pre, dec, batch * new / dec, m))
    out[f"sampler_decode_tok_s_{mode}"] = round(batch * new / dec, 1)
    out[f"sampler_prefill_s_{mode}"] = round(pre, 3)
    print(f"  {mode}: prefill {pre:.2f} s, decode {dec:.2f} s ({batch * new / dec:.0f} tok/s; all "
          f"{[round(t, 2) for t in decode_t[mode]]})" + (f", merge {m:.3f} s per version" if m else ""), flush=True)
  out["sampler_merge_s"] = round(rows[1][4], 3)
  out["sampler_merge_over_apply_decode"] = round(out["sampler_decode_tok_s_merge"] /
                                                 out["sampler_decode_tok_s_apply"], 3)
  print(f"\n| sampler mode (SmolLM2 shape, LoRA r{RANK}, batch {batch}, {prompt}-token prompt, {new} new) |"
        " prefill (s) | decode (s) | decode tok/s | merge per version (s) |")
  print("|---|---:|---:|---:|---:|")
  for mode, pre, dec, tps, m in rows:
    print(f"| {mode} | {pre:.2f} | {dec:.2f} | {tps:.0f} | {m:.3f} |")
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--parts", default="memory,update,sampler")
  ap.add_argument("--seq", type=int, default=8192, help="memory: the session length T")
  ap.add_argument("--layers", type=int, default=24, help="memory: layers of the Qwen2.5-0.5B shape")
  ap.add_argument("--update-batch", type=int, default=2)
  ap.add_argument("--update-seq", type=int, default=256)
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.child:
    print(json.dumps(compile_report(a.child, (1, 8, 1), a.seq, a.layers)))
    return
  import jax
  out: dict = {"date": datetime.date.today().isoformat(), "host": platform.processor() or platform.machine(),
               "backend": jax.default_backend(), "rank": RANK, "alpha": ALPHA,
               "load_avg": round(os.getloadavg()[0], 2)}
  parts = [p for p in a.parts.split(",") if p]
  for p in parts:
    if p not in ("memory", "update", "sampler"):
      ap.error(f"unknown part {p!r}")
  if "memory" in parts:
    out.update(part_memory(a.seq, a.layers), memory_seq=a.seq, memory_layers=a.layers)
  if "update" in parts:
    out.update(part_update(a.update_batch, a.update_seq))
  if "sampler" in parts:
    out.update(part_sampler(batch=8, prompt=64, new=32, reps=5))
  out["load_avg_end"] = round(os.getloadavg()[0], 2)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
