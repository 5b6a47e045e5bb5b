"""sft.pack: behaviour cloning on demos packed several per row equals one demo per row."""
import jax
import numpy as np
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.train.lm_step import lm_loss
from mtrl_jax.train.sft import DemoBatcher

MC = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


def _demos(n=12):
  r = np.random.default_rng(0)
  out = []
  for i in range(n):
    turns = [{"observation": "o" * int(r.integers(1, 12)), "action": "a" * int(r.integers(1, 6))}
             for _ in range(int(r.integers(1, 4)))]
    out.append({"prompt": f"p{i}", "turns": turns, "success": bool(i % 2)})
  return out


def test_packed_sft_loss_and_grads_equal_one_demo_per_row():
  """Same demos (batch k = 0), packed into fewer rows: loss, accuracy and parameter gradients agree.

  Catches: attention across demos sharing a row (verified by dropping
  segment_ids_bt from the model call), positions not restarting per demo,
  a target counted across a segment boundary.
  """
  tok = ByteTokenizer()
  plain = DemoBatcher(_demos(), tok, batch_size=8, seed=3, max_len=128)
  packed = DemoBatcher(_demos(), tok, batch_size=8, seed=3, max_len=128, pack=True, row_multiple=2)
  b_plain, b_packed = plain.batch(0), packed.batch(0)
  assert b_packed.tokens_bt.shape[0] < b_plain.tokens_bt.shape[0]
  assert packed.pad_fraction(0) < plain.pad_fraction(0)
  gd, params = nnx.split(Transformer(MC, rngs=nnx.Rngs(0)))

  @jax.jit  # one compile per batch shape (op-by-op eager dispatch compiled every op: ~5x slower)
  def run(batch):
    return jax.value_and_grad(lambda p: lm_loss(nnx.merge(gd, p), batch), has_aux=True)(params)

  (l0, m0), g0 = run(b_plain)
  (l1, m1), g1 = run(b_packed)
  assert float(m0["n_tokens"]) > 20
  np.testing.assert_allclose(m1["n_tokens"], m0["n_tokens"])
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(m1["accuracy"], m0["accuracy"])
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6)
