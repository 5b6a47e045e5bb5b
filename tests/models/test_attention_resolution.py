"""Which kernel `attention` runs, and the length it hands it (models/attention.py `plan`).

All on CPU: the platform is passed explicitly, and the cuDNN kernel is stood
in for by the einsum reference behind cuDNN's own shape checks (`cudnn_accepts`,
read from JAX's check_is_flash_attention), so the pad/slice path is exercised
exactly as on a GPU, without one.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.models import attention as attn

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32
# The learner's length buckets are multiples of 64 (train/learner.py) and the
# model reads rows shifted by one: 64k - 1 tokens, all odd. Powers of two are
# the packer's default buckets; 255 is the crash.
BUCKETED_SHIFTED = [63, 127, 255, 511, 1023, 4095, 32767]


@pytest.mark.parametrize("t", [1, 37, *BUCKETED_SHIFTED])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_auto_on_gpu_pads_odd_lengths_to_even(t, dtype):
  """Odd lengths (bucketed-and-shifted ones included) go to cuDNN padded by one.

  Catches (checked by a temporary edit): no padding (t_kernel = T: cuDNN's
  training rule raises "Unsupported sequence length").
  """
  p = attn.plan("auto", t, dtype, False, 64, "gpu")
  assert p == attn.AttentionPlan("cudnn", t + 1)
  assert attn.cudnn_accepts(p.t_kernel, dtype, 64, False, training=True)


@pytest.mark.parametrize("t", [2, 64, 128, 256, 4096])
def test_auto_on_gpu_keeps_even_lengths(t):
  """Even lengths reach cuDNN unpadded (no wasted row). Catches always padding by one."""
  assert attn.plan("auto", t, BF16, False, 64, "gpu") == attn.AttentionPlan("cudnn", t)
  assert attn.plan("cudnn", t, F16, False, 128, "gpu") == attn.AttentionPlan("cudnn", t)


@pytest.mark.parametrize("t", [37, 256])
@pytest.mark.parametrize("dtype,head_dim,segments", [
    (F32, 64, False),  # cuDNN is fp16/bf16 only
    (BF16, 64, True),  # packing: not expressible through jax.nn.dot_product_attention
    (BF16, 12, False),  # head dim not a multiple of 8
    (BF16, 192, False),  # head dim over 128 (legal on Hopper only)
], ids=["f32", "segments", "hd12", "hd192"])
def test_cudnn_falls_back_where_no_padding_helps(t, dtype, head_dim, segments):
  """What no padding makes legal runs blockwise, unpadded. Catches a plan that
  sends fp32 / packed rows / odd head dims to cuDNN, or pads for blockwise."""
  for impl in ("auto", "cudnn"):
    assert attn.plan(impl, t, dtype, segments, head_dim, "gpu") == attn.AttentionPlan("blockwise", t)


def test_other_platforms_unchanged():
  """CPU: xla up to AUTO_XLA_MAX_T, blockwise beyond; TPU: splash; never padded here."""
  m = attn.AUTO_XLA_MAX_T
  assert attn.plan("auto", m, F32, False, 64, "cpu") == attn.AttentionPlan("xla", m)
  assert attn.plan("auto", m + 1, BF16, False, 64, "cpu") == attn.AttentionPlan("blockwise", m + 1)
  assert attn.plan("auto", 255, BF16, True, 64, "tpu") == attn.AttentionPlan("splash", 255)
  for impl in ("xla", "blockwise", "splash"):
    assert attn.plan(impl, 255, BF16, False, 64, "gpu") == attn.AttentionPlan(impl, 255)
  with pytest.raises(ValueError, match="needs a GPU"):
    attn.plan("cudnn", 64, BF16, False, 64, "cpu")


@settings(max_examples=300, deadline=None)
@given(t=st.integers(1, 1 << 17), dtype=st.sampled_from([BF16, F16, F32]),
       head_dim=st.sampled_from([8, 12, 16, 64, 80, 96, 128, 160, 256]), segments=st.booleans(),
       impl=st.sampled_from(["auto", "cudnn"]))
def test_plan_never_hands_cudnn_a_refused_shape(t, dtype, head_dim, segments, impl):
  """Property: whatever the arguments, a plan naming cuDNN is one cuDNN's
  differentiated path accepts, pads by less than its granularity, and cuDNN
  is only refused where the table says no length would do.

  Catches (each checked by a temporary edit): no padding, and checking the
  unpadded length against the table (odd rows then fall back to blockwise).
  """
  p = attn.plan(impl, t, dtype, segments, head_dim, "gpu")
  if p.impl == "cudnn":
    assert attn.cudnn_accepts(p.t_kernel, dtype, head_dim, segments, training=True)
    assert t <= p.t_kernel < t + attn.CUDNN_T_MULTIPLE
  else:
    assert p == attn.AttentionPlan("blockwise", t)
    assert not attn.cudnn_accepts(t + (t % 2), dtype, head_dim, segments, training=True)


# ------------------------------------------------------------ the padded path

B, H, KV, HD = 2, 4, 2, 8


def qkv(t, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.standard_normal((B, t, n, HD)), dtype) for n in (H, KV, KV))
  ct = jnp.asarray(rng.standard_normal((B, t, H, HD)), jnp.float32)
  return q, k, v, ct


def out_and_grads(fn, q, k, v, ct):
  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * ct), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return [np.asarray(x, np.float32) for x in (out, *grads)]


@pytest.mark.parametrize("t", [1, 37, 38])
def test_right_padded_is_exact(t):
  """Right padding + cut back gives the unpadded reference's outputs and
  gradients wrt q, k, v (fp32, to float noise). Catches (each checked by a
  temporary edit) cutting the wrong end (out[:, -t:]) and padding on the left
  (real queries then see the zero keys)."""
  q, k, v, ct = qkv(t, F32)
  want = out_and_grads(attn.xla_attention, q, k, v, ct)
  got = out_and_grads(lambda q, k, v: attn.right_padded(attn.xla_attention, q, k, v, t + 3), q, k, v, ct)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(g, w, atol=2e-6, err_msg=name)


@pytest.fixture
def fake_cudnn(monkeypatch):
  """cuDNN stood in for by the fp32 einsum behind cuDNN's shape checks; records the lengths it got."""
  seen = []

  def kernel(q, k, v):
    t = q.shape[1]
    seen.append(t)
    if not attn.cudnn_accepts(t, q.dtype, q.shape[3], False, training=True):
      raise NotImplementedError(f"Unsupported sequence length Q {t}, KV {k.shape[1]}.")
    f32 = lambda x: x.astype(F32)
    return attn.xla_attention(f32(q), f32(k), f32(v)).astype(q.dtype)

  monkeypatch.setattr(attn, "cudnn_attention", kernel)
  return seen


@pytest.mark.parametrize("t", [37, 38])
def test_attention_auto_on_gpu_runs_cudnn_on_even_rows(fake_cudnn, t):
  """`attention(impl="auto")` on platform "gpu" with bf16: the (stand-in) cuDNN
  kernel gets an even length and the outputs/gradients are the unpadded
  reference's. Catches (checked) the issue's crash: without padding the odd
  T reaches the stand-in, which raises as cuDNN does; and a slice of the wrong end."""
  q, k, v, ct = qkv(t, BF16, seed=1)
  got = out_and_grads(lambda q, k, v: attn.attention(q, k, v, impl="auto", platform="gpu"), q, k, v, ct)
  assert fake_cudnn == [t + t % 2]
  f32 = lambda x: x.astype(F32)
  want = out_and_grads(lambda q, k, v: attn.xla_attention(f32(q), f32(k), f32(v)).astype(BF16), q, k, v, ct)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(g, w, atol=1e-2 * max(1.0, np.abs(w).max()), err_msg=name)
