"""Shared helpers of the sampler tests (imported by name: tests/sampling is on
sys.path under pytest's default import mode): a tiny policy whose logits are
well separated, and a from-scratch reference that never uses a KV cache."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer

CFG = ModelConfig(vocab_size=264, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128,
                  tie_embeddings=False)
REF_LEN = 160  # every reference forward is padded to this length: one compile
PAD = 0


def tiny_policy(seed: int = 0, cfg: ModelConfig = CFG, head_std: float = 0.3) -> Transformer:
  """A random policy whose (untied) LM head is wide enough that the logits
  are O(1) apart: argmax ties, which would make cached-vs-recomputed
  comparisons flaky, are then vanishingly rare."""
  model = Transformer(cfg, rngs=nnx.Rngs(seed))
  key = jax.random.key(seed + 1000)
  model.lm_head[...] = head_std * jax.random.normal(key, model.lm_head[...].shape, jnp.float32)
  return model


@functools.lru_cache(maxsize=None)
def _forward(graphdef):
  @jax.jit
  def run(params, tokens_bt):
    return nnx.merge(graphdef, params)(tokens_bt)[0]
  return run


def full_logits(model: Transformer, rows) -> np.ndarray:
  """fp32 logits [B, REF_LEN, V] of a plain (cache-free) forward over each
  row, right-padded (causal attention makes the padding invisible)."""
  tokens = np.full((len(rows), REF_LEN), PAD, np.int32)
  for b, r in enumerate(rows):
    assert len(r) <= REF_LEN, "raise REF_LEN"
    tokens[b, :len(r)] = r
  graphdef, params = nnx.split(model)
  return np.asarray(_forward(graphdef)(params, jnp.asarray(tokens)))


def next_logits(model: Transformer, rows) -> np.ndarray:
  """[B, V] logits after the last token of each (non-empty) row."""
  logits = full_logits(model, rows)
  return np.stack([logits[b, len(r) - 1] for b, r in enumerate(rows)])


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def allowed_set(logits_v: np.ndarray, temperature: float, top_k: int, top_p: float):
  """Reference support and filtered log-probs (numpy, float64) for one row:
  temperature, then the top_k largest, then the shortest prefix (descending)
  whose probability mass reaches top_p."""
  scaled = logits_v.astype(np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")
  k = top_k if 0 < top_k < len(scaled) else len(scaled)
  kept = order[:k]
  if top_p < 1.0:
    p = np.exp(log_softmax(scaled[kept]))
    before = np.cumsum(p) - p
    kept = kept[before < top_p]
  logp = np.full(len(scaled), -np.inf)
  logp[kept] = log_softmax(scaled[kept])
  return set(kept.tolist()), logp


def random_rows(rng: np.random.Generator, lengths, low: int = 8, high: int = 264):
  return [rng.integers(low, high, size=n).tolist() for n in lengths]
