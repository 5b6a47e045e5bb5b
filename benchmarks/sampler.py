"""Sampler throughput: mtrl_jax's KV-cache sampler vs transformers `generate`
(same weights, CPU torch) vs a no-cache recompute loop, plus the cost of a
late turn of a 16-turn session relative to its first turn.

    python benchmarks/sampler.py            # ~3.5 min on a 2-core CPU
    python benchmarks/sampler.py --reps 3   # quicker, noisier

Prints a table, then (last line) one JSON object. Throughputs are best-of
`--reps` interleaved repetitions (medians are printed too: on a shared
machine other processes inflate medians, torch's far more than XLA's); the
turn ratios use medians. A warm-up first compiles every shape.
The HF and JAX models share the weights: a random LlamaForCausalLM is saved
with `save_pretrained` and loaded with `mtrl_jax.models.hf.load_policy`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models.hf import load_policy
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

GREEDY = SamplingParams(greedy=True)


def build_hf_model(hf_dir: str, vocab: int, seed: int):
  import torch
  import transformers
  torch.manual_seed(seed)
  cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                 pad_token_id=0)
  model = transformers.LlamaForCausalLM(cfg).eval()  # default attention implementation
  model.save_pretrained(hf_dir)
  return model


def hf_generate(model, prompt_bt: np.ndarray, n_new: int) -> np.ndarray:
  import torch
  ids = torch.as_tensor(prompt_bt, dtype=torch.long)
  with torch.inference_mode():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
  out = out[:, prompt_bt.shape[1]:].numpy()
  assert out.shape[1] == n_new, out.shape  # eos disabled: the full length
  return out


def make_nocache_decoder(policy, batch: int, total: int, n_new: int):
  """Greedy decoding that re-runs the full forward over the padded buffer at
  every step (no KV cache), the whole loop jitted into one call."""
  graphdef, params = nnx.split(policy)

  @jax.jit
  def run(params, buf_bt, start):
    model = nnx.merge(graphdef, params)

    def step(i, buf_bt):
      logits_btv, _ = model(buf_bt)
      cur = start + i
      tok_b = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_btv, cur - 1, axis=1, keepdims=False), -1)
      return jax.lax.dynamic_update_slice_in_dim(buf_bt, tok_b[:, None].astype(buf_bt.dtype), cur, axis=1)

    return jax.lax.fori_loop(0, n_new, step, buf_bt)

  def decode(prompt_bt):
    buf = np.zeros((batch, total), np.int32)
    buf[:, :prompt_bt.shape[1]] = prompt_bt
    out = run(params, jnp.asarray(buf), prompt_bt.shape[1])
    return np.asarray(out)[:, prompt_bt.shape[1]:]

  return decode


def sampler_decode(sampler, prompt_bt: np.ndarray, n_new: int, capacity: int):
  """init_state + append (prefill) + generate: the whole request, timed in parts."""
  t0 = time.perf_counter()
  state = sampler.init_state(prompt_bt.shape[0], capacity)
  state = jax.block_until_ready(sampler.append(state, prompt_bt.tolist()))
  t1 = time.perf_counter()
  out, state = sampler.generate(state, jax.random.key(0), n_new, params=GREEDY)
  t2 = time.perf_counter()
  return np.stack(out.tokens), t1 - t0, t2 - t1


def session_turn_times(sampler, batch: int, turns: int, obs_len: int, act_len: int, capacity: int, seed: int):
  """Seconds of each turn (append obs_len tokens + generate act_len) of one
  batch of `batch` sessions in lockstep."""
  rng = np.random.default_rng(seed)
  state = sampler.init_state(batch, capacity)
  jax.block_until_ready(state)
  times = []
  for t in range(turns):
    obs = rng.integers(8, sampler.cfg.vocab_size, size=(batch, obs_len)).tolist()
    t0 = time.perf_counter()
    state = sampler.append(state, obs)
    out, state = sampler.generate(state, jax.random.key(t), act_len, params=GREEDY)
    times.append(time.perf_counter() - t0)
    assert all(len(x) == act_len for x in out.tokens)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt", type=int, default=32)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--reps", type=int, default=9)
  parser.add_argument("--nocache_reps", type=int, default=3)
  parser.add_argument("--turns", type=int, default=16)
  parser.add_argument("--obs", type=int, default=24)
  parser.add_argument("--act", type=int, default=16)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  import torch
  import transformers
  torch.set_num_threads(os.cpu_count() or 1)
  vocab, b, n_new = 264, args.batch, args.new
  with tempfile.TemporaryDirectory() as hf_dir:
    hf_model = build_hf_model(hf_dir, vocab, args.seed)
    policy = load_policy(hf_dir)
  attn_impl = hf_model.config._attn_implementation
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))

  # Stop ids disabled, like eos for HF: every row decodes the full length.
  sampler = Sampler.from_model(policy, pad_id=0, stop_ids=(), log_compiles=False)
  capacity = args.prompt + n_new
  nocache = make_nocache_decoder(policy, b, capacity, n_new)
  prompt = np.random.default_rng(args.seed).integers(8, vocab, size=(b, args.prompt)).astype(np.int32)

  # Warm-up: compile every program once (and let torch allocate its caches).
  ours_tokens = sampler_decode(sampler, prompt, n_new, capacity)[0]
  hf_tokens = hf_generate(hf_model, prompt, n_new)
  nocache_tokens = nocache(prompt)

  hf_s, ours_s, prefill_s, decode_s, nocache_s = [], [], [], [], []
  for rep in range(args.reps):  # interleaved, so load from other processes hits all alike
    t0 = time.perf_counter()
    hf_generate(hf_model, prompt, n_new)
    hf_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _, pre, dec = sampler_decode(sampler, prompt, n_new, capacity)
    ours_s.append(time.perf_counter() - t0)
    prefill_s.append(pre)
    decode_s.append(dec)
    if rep < args.nocache_reps:  # ~50x slower than the others: a few runs suffice
      t0 = time.perf_counter()
      nocache(prompt)
      nocache_s.append(time.perf_counter() - t0)
  med = statistics.median
  n_tok = b * n_new
  sampler_tok_s, hf_tok_s, nocache_tok_s = n_tok / min(ours_s), n_tok / min(hf_s), n_tok / min(nocache_s)

  # Greedy parity: same weights should give the same argmax tokens (up to
  # near-ties flipped by fp32 rounding, which random tiny models do have).
  first_diff = [int(np.argmax(r != h)) if (r != h).any() else n_new for r, h in zip(ours_tokens, hf_tokens)]
  rows_equal_hf = int(sum(d == n_new for d in first_diff))
  rows_equal_nocache = int((ours_tokens == nocache_tokens).all(axis=1).sum())

  # Multi-turn sessions: turn t appends an observation then decodes an action.
  session_cap = 1024
  ratios = {}
  turn_ms = {}
  for sb in (1, b):
    session_turn_times(sampler, sb, args.turns, args.obs, args.act, session_cap, seed=99)  # compiles windows
    reps = [session_turn_times(sampler, sb, args.turns, args.obs, args.act, session_cap, seed=r)
            for r in range(args.reps)]
    per_turn = [med([rep[t] for rep in reps]) for t in range(args.turns)]
    turn_ms[sb] = per_turn
    ratios[sb] = per_turn[-1] / per_turn[0]

  cpu = platform.processor() or platform.machine()
  rows = [
      ("model", f"Llama {n_params / 1e6:.2f}M params (dim 256, 4 layers, 4 heads / 2 kv, mlp 704, vocab {vocab}), fp32"),
      ("request", f"batch {b}, prompt {args.prompt}, {n_new} new tokens, greedy, no stop id"),
      ("mtrl_jax sampler", f"{sampler_tok_s:8.0f} tok/s best, {n_tok / med(ours_s):.0f} median  (best: prefill "
                           f"{1e3 * min(prefill_s):.1f} ms + decode {1e3 * min(decode_s):.1f} ms)"),
      ("  decode only", f"{n_tok / min(decode_s):8.0f} tok/s best"),
      (f"HF generate ({attn_impl})", f"{hf_tok_s:8.0f} tok/s best, {n_tok / med(hf_s):.0f} median  "
                                     f"(torch {torch.__version__}, {torch.get_num_threads()} threads)"),
      ("no-cache recompute (jit)", f"{nocache_tok_s:8.0f} tok/s best, {n_tok / med(nocache_s):.0f} median"),
      ("sampler / HF", f"{sampler_tok_s / hf_tok_s:8.2f} x"),
      ("sampler / no-cache", f"{sampler_tok_s / nocache_tok_s:8.2f} x"),
      ("greedy rows == HF", f"{rows_equal_hf}/{b} (first divergence per row: {first_diff})"),
      ("greedy rows == no-cache", f"{rows_equal_nocache}/{b}"),
  ]
  for sb in (1, b):
    ms = turn_ms[sb]
    # Turns 1, 4, 8 and the last (16 by default), those that exist with a smaller --turns.
    shown = sorted({t for t in (1, 4, 8) if t < len(ms)} | {len(ms)})
    rows.append((f"session batch {sb}: turn ms", ", ".join(f"t{t} {1e3 * ms[t - 1]:.1f}" for t in shown)))
    rows.append((f"session batch {sb}: turn{len(ms)}/turn1", f"{ratios[sb]:8.2f}"))
  rows.append(("compiled shapes", str(sampler.compile_count())))
  rows.append(("machine", f"{os.cpu_count()} cores {cpu}, jax {jax.__version__} ({jax.default_backend()}), "
                          f"transformers {transformers.__version__}, load avg {os.getloadavg()[0]:.1f}"))
  width = max(len(k) for k, _ in rows)
  print("Sampler benchmark")
  for k, v in rows:
    print(f"  {k:<{width}}  {v}")

  result = {
      "sampler_tok_s": round(sampler_tok_s, 1),
      "hf_generate_tok_s": round(hf_tok_s, 1),
      "nocache_tok_s": round(nocache_tok_s, 1),
      "turn16_over_turn1": round(ratios[1], 3),
      f"turn16_over_turn1_b{b}": round(ratios[b], 3),
      "sampler_over_hf": round(sampler_tok_s / hf_tok_s, 2),
      "sampler_decode_only_tok_s": round(n_tok / min(decode_s), 1),
      "sampler_tok_s_median": round(n_tok / med(ours_s), 1),
      "hf_generate_tok_s_median": round(n_tok / med(hf_s), 1),
      "turn1_ms": round(1e3 * turn_ms[1][0], 2), "turn16_ms": round(1e3 * turn_ms[1][-1], 2),
      f"turn1_ms_b{b}": round(1e3 * turn_ms[b][0], 2), f"turn16_ms_b{b}": round(1e3 * turn_ms[b][-1], 2),
      "hf_attn_implementation": attn_impl,
      "greedy_rows_equal_hf": rows_equal_hf,
      "batch": b, "new_tokens": n_new, "prompt_tokens": args.prompt, "params": n_params, "reps": args.reps,
      "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
      "date": datetime.date.today().isoformat(),
  }
  print(json.dumps(result))


if __name__ == "__main__":
  main()
