"""Training-path attention kernels against the einsum reference (models/attention.py).

Every kernel that runs on CPU (blockwise; splash interpreted) must give the
reference's outputs AND gradients wrt q, k, v, with GQA, ragged and packed
rows and lengths that are not a multiple of the block.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models import attention as attn
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer

B, T, H, HD = 2, 37, 4, 8  # T = 37: not a multiple of any block used here
# Row 0 packs two sequences (10 and 20 tokens) then 7 padding tokens (id -1);
# row 1 is one sequence filling the row.
SEGMENTS = np.array([[0] * 10 + [1] * 20 + [-1] * 7, [5] * T], np.int32)
PIECES = [(0, 0, 10), (0, 10, 30), (1, 0, T)]  # (row, start, stop) of each sequence
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 4e-2}


def inputs(kv, dtype, seed=0, t=T):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.standard_normal((B, t, n, HD)), dtype) for n in (H, kv, kv))
  ct = jnp.asarray(rng.standard_normal((B, t, H, HD)), jnp.float32)
  return q, k, v, ct


def out_and_grads(fn, q, k, v, ct, seg):
  """Jitted output and d/d(q,k,v) of sum(out * ct), all as fp32 numpy."""
  def loss(q, k, v):
    out = fn(q, k, v, seg)
    return jnp.sum(out.astype(jnp.float32) * ct), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  assert out.dtype == q.dtype
  return [np.asarray(x, np.float32) for x in (out, *grads)]


def reference(q, k, v, ct, seg):
  """The fp32 einsum reference on the (possibly bf16-rounded) inputs."""
  f32 = lambda x: x.astype(jnp.float32)
  return out_and_grads(attn.xla_attention, f32(q), f32(k), f32(v), ct, seg)


def assert_close(got, want, tol, what):
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    scale = max(1.0, np.abs(w).max())
    err = np.abs(g - w).max()
    assert err <= tol * scale, f"{what}: {name} differs by {err:.3g} (scale {scale:.3g})"


def blockwise(block_q, block_kv):
  return lambda q, k, v, seg: attn.blockwise_attention(q, k, v, seg, block_q=block_q, block_kv=block_kv)


def splash(q, k, v, seg):
  return attn.splash_attention(q, k, v, seg, block_q=128, block_kv=128, interpret=True)


# Each case compiles anew (tens of seconds on a loaded CPU), so the cases cover
# the axes (dtype, GQA ratio, packing, block shapes) without the full product.
@pytest.mark.parametrize("dtype,kv,packed,blocks", [
    (jnp.float32, 2, True, (8, 16)),
    (jnp.float32, 1, False, (16, 8)),
    (jnp.bfloat16, 2, False, (64, 64)),
    (jnp.bfloat16, 1, True, (8, 8)),
], ids=["f32-kv2-packed-8x16", "f32-kv1-16x8", "bf16-kv2-oneblock", "bf16-kv1-packed-8x8"])
def test_blockwise_matches_reference(dtype, kv, packed, blocks):
  """Outputs and gradients equal the einsum reference's.

  Blocks (8,16)/(16,8) leave a partial last block and give q and kv blocks
  different sizes; (64,64) is one block larger than T. Catches (each verified
  by a temporary edit): dropping the segment mask, an off-by-one causal mask
  (k < q or k <= q + 1), skipping one kv block too many in the forward or the
  dq pass, starting the dk/dv pass one q block late, and a backward that
  uses m instead of the log-sum-exp (or drops delta).
  """
  q, k, v, ct = inputs(kv, dtype)
  seg = jnp.asarray(SEGMENTS) if packed else None
  got = out_and_grads(blockwise(*blocks), q, k, v, ct, seg)
  assert_close(got, reference(q, k, v, ct, seg), TOL[dtype], f"blockwise{blocks}")


@pytest.mark.parametrize("dtype,kv,packed", [(jnp.float32, 2, True), (jnp.bfloat16, 1, False)],
                         ids=["f32-kv2-packed", "bf16-kv1"])
def test_splash_interpreted_matches_reference(dtype, kv, packed):
  """The Pallas splash kernel (interpreted on CPU) against the reference.

  Catches dropping the SegmentIds, or not pre-scaling q.
  """
  q, k, v, ct = inputs(kv, dtype)
  seg = jnp.asarray(SEGMENTS) if packed else None
  assert_close(out_and_grads(splash, q, k, v, ct, seg), reference(q, k, v, ct, seg), TOL[dtype], "splash")


@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_packed_row_equals_each_sequence_alone(impl):
  """A row packing two sequences gives each one's outputs and input gradients alone.

  Checks the reference itself too (its segment mask is the oracle of the
  others). Catches dropping the segment mask (in either implementation).
  """
  fn = attn.xla_attention if impl == "xla" else blockwise(8, 8)
  q, k, v, ct = inputs(2, jnp.float32, seed=1)
  packed = out_and_grads(fn, q, k, v, ct, jnp.asarray(SEGMENTS))
  for row, lo, hi in PIECES:
    cut = lambda x: x[row:row + 1, lo:hi]
    alone = out_and_grads(fn, cut(q), cut(k), cut(v), cut(ct), None)
    for p, a in zip(packed, alone):
      np.testing.assert_allclose(p[row:row + 1, lo:hi], a, atol=2e-5)


@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_padding_rows_are_finite(impl):
  """Every pad token its own segment (and one row all padding): no NaN anywhere.

  Each query always sees itself, so no softmax row is empty. Catches a
  blockwise kernel that divides by an empty row's zero normaliser.
  """
  fn = attn.xla_attention if impl == "xla" else blockwise(8, 8)
  q, k, v, ct = inputs(2, jnp.float32, seed=2)
  seg = np.array([[7] * 5 + list(range(100, 100 + T - 5)), [-1] * T], np.int32)
  for x in out_and_grads(fn, q, k, v, ct, jnp.asarray(seg)):
    assert np.all(np.isfinite(x))


def test_empty_rows_give_zero_not_nan():
  """The blockwise kernel's guard for a query with nothing visible (not reachable
  through `attention`, where each token sees itself): output 0, finite grads.

  Catches removing the `l > 0` guards (0/0 = NaN).
  """
  q, k, v, ct = inputs(1, jnp.float32, seed=3, t=16)
  q5 = q.reshape(B, 16, 1, H, HD).transpose(0, 2, 3, 1, 4)
  k4, v4 = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  seg_q = jnp.zeros((B, 16), jnp.int32)
  seg_k = jnp.ones((B, 16), jnp.int32)  # no key shares a query's segment

  def loss(q5, k4, v4):
    return jnp.sum(attn._flash(q5, k4, v4, seg_q, seg_k, 0.3, 8, 8) ** 2)

  out = jax.jit(attn._flash, static_argnums=(5, 6, 7))(q5, k4, v4, seg_q, seg_k, 0.3, 8, 8)
  np.testing.assert_array_equal(np.asarray(out), 0.0)
  for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q5, k4, v4):
    assert np.all(np.isfinite(np.asarray(g)))


def _temp_bytes(impl, t):
  def loss(q, k, v):
    return jnp.sum(attn.attention(q, k, v, impl=impl, block_q=256, block_kv=256))

  sds = lambda n: jax.ShapeDtypeStruct((1, t, n, 32), jnp.float32)
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(sds(2), sds(1), sds(1)).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_is_linear_in_length():
  """Compiled temp memory of forward+backward grows < 6x for 4x the length.

  The reference grows ~10x here (~16x once [T,T] scores dominate), which shows
  the measure can tell. Catches a blockwise kernel whose backward is left to
  autodiff (it saves every block's probabilities: quadratic).
  """
  ratio = _temp_bytes("blockwise", 4096) / _temp_bytes("blockwise", 1024)
  assert ratio < 6, ratio
  assert _temp_bytes("xla", 4096) / _temp_bytes("xla", 1024) > 8


def test_auto_choice_and_clear_errors():
  """`auto` picks per platform/length; cudnn off GPU says so; bad names are named."""
  f32, bf16 = jnp.float32, jnp.bfloat16
  assert attn.resolve_impl("auto", attn.AUTO_XLA_MAX_T, f32, False, "cpu") == "xla"
  assert attn.resolve_impl("auto", attn.AUTO_XLA_MAX_T + 1, f32, False, "cpu") == "blockwise"
  assert attn.resolve_impl("auto", 64, bf16, False, "tpu") == "splash"
  assert attn.resolve_impl("auto", 64, bf16, False, "gpu") == "cudnn"
  assert attn.resolve_impl("auto", 64, bf16, True, "gpu") == "blockwise"  # cuDNN can't pack
  assert attn.resolve_impl("cudnn", 64, f32, False, "gpu") == "blockwise"  # cuDNN is fp16/bf16 only
  with pytest.raises(ValueError, match="needs a GPU"):
    attn.resolve_impl("cudnn", 64, bf16, False, "cpu")
  with pytest.raises(ValueError, match="flash"):
    attn.resolve_impl("flash", 64, bf16, False, "cpu")
  with pytest.raises(ValueError, match="ModelConfig.attention"):
    ModelConfig(attention="flash")
  with pytest.raises(ValueError, match="ModelConfig.attention_block"):
    ModelConfig(attention_block=0)


@pytest.mark.gpu  # cuDNN attention needs a GPU: deselected elsewhere (tests/conftest.py)
@pytest.mark.parametrize("kv", [2, 1])
def test_cudnn_matches_reference(kv):
  """cuDNN flash attention (bf16) against the reference; GQA included."""
  q, k, v, ct = inputs(kv, jnp.bfloat16, t=128)
  fn = lambda q, k, v, seg: attn.attention(q, k, v, impl="cudnn")
  assert_close(out_and_grads(fn, q, k, v, ct, None), reference(q, k, v, ct, None), TOL[jnp.bfloat16], "cudnn")


@pytest.mark.gpu  # cuDNN attention needs a GPU: deselected elsewhere (tests/conftest.py)
@pytest.mark.parametrize("t", [255, 37, 1, 64])
@pytest.mark.parametrize("impl", ["auto", "cudnn"])
def test_cudnn_odd_lengths_match_reference(t, impl):
  """bf16 rows of odd length (255: the trainer's shifted 256-token rows) through
  `attention` on a GPU: outputs and gradients equal the reference's, where a bare
  cuDNN call on an odd length raises in the backward. Catches removing the
  padding to an even length (models/attention.py `plan`)."""
  q, k, v, ct = inputs(2, jnp.bfloat16, t=t)
  fn = lambda q, k, v, seg: attn.attention(q, k, v, impl=impl)
  assert attn.plan(impl, t, jnp.bfloat16, False, HD, "gpu").impl == "cudnn"
  assert_close(out_and_grads(fn, q, k, v, ct, None), reference(q, k, v, ct, None), TOL[jnp.bfloat16],
               f"cudnn T={t}")


@pytest.mark.gpu  # cuDNN attention needs a GPU: deselected elsewhere (tests/conftest.py)
def test_cudnn_bare_call_refuses_odd_training_length():
  """The table's claim (models/attention.py, cudnn_accepts): JAX's cuDNN path
  refuses an odd length when differentiated. If this starts failing, a newer
  JAX lifted the limit: the padding is then unneeded (still exact)."""
  q, k, v, ct = inputs(2, jnp.bfloat16, t=37)
  bare = lambda q, k, v, seg: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
  with pytest.raises(NotImplementedError, match="sequence length"):
    out_and_grads(bare, q, k, v, ct, None)


# ------------------------------------------------------------------ the model

CFG = ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                  rope_theta=1000.0, qkv_bias=True, tie_embeddings=False, attention="xla",
                  attention_block=8)


def random_model(cfg):
  rng = np.random.default_rng(0)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  for path, var in nnx.to_flat_state(params):
    shape = var.get_value().shape
    base = 1.0 if path[-1] == "scale" else 0.0
    var.set_value(jnp.asarray(base + 0.2 * rng.standard_normal(shape), cfg.weight_dtype))
  return graphdef, params, rest


def model_logits_and_grads(cfg, tokens_bt, positions_bt=None, segment_ids_bt=None):
  graphdef, params, rest = random_model(cfg)  # the same numbers whatever cfg.attention

  @jax.jit
  def run(params):
    logits, _ = nnx.merge(graphdef, params, rest)(tokens_bt, positions_bt=positions_bt,
                                                  segment_ids_bt=segment_ids_bt)
    return jnp.sum(jnp.sin(logits)), logits

  (_, logits), grads = jax.value_and_grad(run, has_aux=True)(params)
  return np.asarray(logits), {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(grads)}


def test_model_blockwise_equals_xla():
  """attention="blockwise" gives the logits and parameter gradients of "xla".

  Catches ModelConfig.attention not reaching the layer (checked by making
  blockwise wrong: the comparison then fails).
  """
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, CFG.vocab_size, (B, T)))
  ref_logits, ref_grads = model_logits_and_grads(CFG, tokens)
  logits, grads = model_logits_and_grads(dataclasses.replace(CFG, attention="blockwise"), tokens)
  np.testing.assert_allclose(logits, ref_logits, atol=2e-5 * np.abs(ref_logits).max())
  for path, g in ref_grads.items():  # fp32 sums in another order: relative to the largest entry
    np.testing.assert_allclose(grads[path], g, atol=2e-5 * max(1.0, np.abs(g).max()), err_msg=str(path))


def test_model_packed_row_equals_sequences_alone():
  """Through the whole model: a packed row (positions restarting per segment)
  gives each sequence's logits alone. Catches segment ids not threaded
  through Transformer -> Block -> Attention (kernels are compared above, so
  the cheap-to-compile xla one does here).
  """
  cfg = CFG
  tokens = np.random.default_rng(5).integers(0, CFG.vocab_size, (B, T))
  positions = np.concatenate([np.arange(10), np.arange(20), np.arange(7)])[None].repeat(B, 0)
  positions[1] = np.arange(T)
  packed, _ = model_logits_and_grads(cfg, jnp.asarray(tokens), jnp.asarray(positions, jnp.int32),
                                     jnp.asarray(SEGMENTS))
  for row, lo, hi in PIECES:
    alone, _ = model_logits_and_grads(cfg, jnp.asarray(tokens[row:row + 1, lo:hi]))
    np.testing.assert_allclose(packed[row:row + 1, lo:hi], alone, atol=2e-5)
