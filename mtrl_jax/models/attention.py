"""Training-path self-attention (no KV cache): one interface, several kernels.

    out_bthd = attention(q_bthd, k_bskd, v_bskd, segment_ids_bt=None, impl="auto")

Masking: causal by index (key s is visible to query t iff s <= t) and, when
`segment_ids_bt` (int32 [B,T]) is given, only within a token's own segment
(packing: several sessions per row). Any int32 value is a valid segment id.
Padding convention: give padding its own id (e.g. -1; a trailing run of pad
tokens, or one id per pad token, both work). Because every token sees at least
itself, no query row is ever fully masked, so padded rows give finite outputs;
they are meaningless and must be masked out of the loss by the caller.
Without segment ids, right padding is harmless for the same reason it always
was: real tokens never look right.

GQA: q has H heads, k/v have KV heads with H % KV == 0; query head h reads kv
head h // (H // KV). The output has q's dtype; softmax statistics are fp32.

Implementations (see docs/scale.md, "Attention"):
  xla       reference einsum; materialises [B,H,T,T] scores (quadratic memory).
  blockwise online-softmax ("flash") attention in plain JAX with a custom VJP
            that recomputes scores per block from the saved output and
            log-sum-exp: memory linear in T, forward and backward. Portable.
  cudnn     jax.nn.dot_product_attention(implementation="cudnn"), GPU only,
            fp16/bf16 only; rows right-padded to an even length (its
            differentiated path refuses odd ones); falls back to blockwise
            where no padding makes the call legal: segment ids (cuDNN's mask
            argument would be a dense [B,H,T,T] bias), fp32 inputs, a head
            dim it does not take. The table is `cudnn_accepts`.
  splash    Pallas TPU splash attention; interpreted (slow, for tests) off TPU.
  auto      cudnn on GPU, splash on TPU; on CPU xla up to AUTO_XLA_MAX_T (512)
            and blockwise beyond.

`plan(...)` is the pure decision (kernel and the length it is handed) for a
given platform; `attention` runs it.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "blockwise")

# On CPU the einsum is faster than blockwise up to here (fwd+bwd measured at
# the default job's shapes, docs/scale.md); at 1024 the two are even and the
# einsum's [B,H,T,T] scores already cost GiBs, so longer rows go blockwise.
AUTO_XLA_MAX_T = 512


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


# A finite "minus infinity": masked scores never become NaN through inf - inf.
_NEG = -1e30


# What cuDNN flash attention accepts on its fp16/bf16 path, as JAX checks it
# before the call (jax/_src/cudnn/fused_attention_stablehlo.py,
# check_is_flash_attention, read in jax 0.10.2):
#   dtype     float16 or bfloat16
#   head_dim  a multiple of 8, <= 128 (<= 256 from Hopper on; 128 is what
#             every generation takes, and a pure function cannot ask the card)
#   T, S      forward alone: any. Differentiated: both EVEN. Its training
#             rule always hands the check a bias (an empty placeholder when
#             the caller gives none), and "training with a bias" wants
#             T % 2 == S % 2 == 0: hence "Unsupported sequence length Q 255,
#             KV 255" on the trainer's shifted 256-token rows.
#   masks     causal by index (is_causal). Packing would need per-segment
#             q/kv offsets, which jax.nn.dot_product_attention does not take
#             (and the packed layout wants Hopper); a mask becomes a dense
#             [B,H,T,T] bias. So segment ids are not expressible.
# `attention` cannot know whether it will be differentiated, so it always
# hands cuDNN an even length: right padding is exact for causal attention (a
# real query never sees a later key, the padded outputs are cut off, so no
# gradient reaches the padding).
CUDNN_DTYPES = ("float16", "bfloat16")
CUDNN_HEAD_DIM_MULTIPLE = 8
CUDNN_MAX_HEAD_DIM = 128
CUDNN_T_MULTIPLE = 2  # the differentiated path's granularity


def cudnn_accepts(t: int, dtype, head_dim: int, has_segments: bool, training: bool = True) -> bool:
  """Whether cuDNN flash attention takes this causal self-attention call (the table above)."""
  return (jnp.dtype(dtype).name in CUDNN_DTYPES and head_dim % CUDNN_HEAD_DIM_MULTIPLE == 0
          and 0 < head_dim <= CUDNN_MAX_HEAD_DIM and not has_segments
          and t >= 1 and (not training or t % CUDNN_T_MULTIPLE == 0))


class AttentionPlan(NamedTuple):
  """What `attention` runs: the kernel, and the row length it hands that kernel
  (>= the real length; the difference is right padding, cut off afterwards)."""
  impl: str
  t_kernel: int


def plan(impl: str, t: int, dtype, has_segments: bool, head_dim: int, platform: str) -> AttentionPlan:
  """The kernel and kernel length for these arguments on `platform`: a pure function.

  Never hands cuDNN a shape `cudnn_accepts` refuses (differentiated or not):
  an odd length is padded by one; what no padding makes legal (segment ids,
  fp32, a head dim it does not take) runs blockwise instead. Splash pads
  inside its own wrapper; xla and blockwise take any length.
  """
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"attention impl {impl!r}; choose one of {ATTENTION_IMPLS}")
  if impl == "auto":
    if platform == "gpu":
      impl = "cudnn"
    elif platform == "tpu":
      return AttentionPlan("splash", t)
    else:
      return AttentionPlan("xla" if t <= AUTO_XLA_MAX_T else "blockwise", t)
  if impl == "cudnn":
    if platform != "gpu":
      raise ValueError(f"attention impl 'cudnn' needs a GPU backend, this one is {platform!r}; "
                       "use 'blockwise' (any backend) or 'auto'")
    t_kernel = _round_up(t, CUDNN_T_MULTIPLE)
    if not cudnn_accepts(t_kernel, dtype, head_dim, has_segments):
      return AttentionPlan("blockwise", t)
    return AttentionPlan("cudnn", t_kernel)
  return AttentionPlan(impl, t)


def resolve_impl(impl: str, t: int, dtype, has_segments: bool, platform: str | None = None,
                 head_dim: int = 64) -> str:
  """The implementation `attention` actually runs for these arguments (`plan(...).impl`)."""
  return plan(impl, t, dtype, has_segments, head_dim, platform or jax.default_backend()).impl


def right_padded(kernel, q_bthd, k_bskd, v_bskd, t_kernel: int):
  """`kernel(q, k, v)` on rows right-padded with zeros to `t_kernel`, cut back to T.

  Exact for causal attention without segment ids: a real query (index < T)
  sees no key at index >= T, and the padded queries' outputs are dropped, so
  neither values nor gradients of the real positions change.
  """
  t = q_bthd.shape[1]
  if t_kernel == t:
    return kernel(q_bthd, k_bskd, v_bskd)
  if t_kernel < t:
    raise ValueError(f"right_padded: t_kernel {t_kernel} < T {t}")
  pad = [(0, 0), (0, t_kernel - t), (0, 0), (0, 0)]
  out = kernel(jnp.pad(q_bthd, pad), jnp.pad(k_bskd, pad), jnp.pad(v_bskd, pad))
  return out[:, :t]


def cudnn_attention(q_bthd, k_bskd, v_bskd):
  """cuDNN flash attention, causal; the caller hands it legal shapes (`plan`)."""
  return jax.nn.dot_product_attention(q_bthd, k_bskd, v_bskd, is_causal=True, implementation="cudnn")


def attention(q_bthd, k_bskd, v_bskd, *, segment_ids_bt=None, impl="auto", block_q=512, block_kv=512,
              platform: str | None = None):
  """Causal (and same-segment) self-attention; see the module docstring.

  `platform` (default: JAX's default backend) only picks the kernel (`plan`).
  """
  b, t, h, hd = q_bthd.shape
  if k_bskd.shape != v_bskd.shape or k_bskd.shape[:2] != (b, t) or k_bskd.shape[3] != hd:
    raise ValueError(f"attention: q {q_bthd.shape}, k {k_bskd.shape}, v {v_bskd.shape}; "
                     "want q [B,T,H,hd] and k = v [B,T,KV,hd] (self-attention, S == T)")
  if h % k_bskd.shape[2]:
    raise ValueError(f"attention: {h} query heads is not a multiple of {k_bskd.shape[2]} kv heads")
  if segment_ids_bt is not None and segment_ids_bt.shape != (b, t):
    raise ValueError(f"attention: segment_ids_bt {segment_ids_bt.shape}, want {(b, t)}")
  impl, t_kernel = plan(impl, t, q_bthd.dtype, segment_ids_bt is not None, hd,
                        platform or jax.default_backend())
  if impl == "xla":
    return xla_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt)
  if impl == "blockwise":
    return blockwise_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt, block_q=block_q, block_kv=block_kv)
  if impl == "cudnn":
    # Looked up at call time so the tests can stand in a CPU kernel with cuDNN's shape checks.
    return right_padded(cudnn_attention, q_bthd, k_bskd, v_bskd, t_kernel)
  return splash_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt, block_q=block_q, block_kv=block_kv,
                          interpret=jax.default_backend() != "tpu")


# ------------------------------------------------------------------ reference

def xla_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt=None):
  """The plain einsum reference: full [B,KV,R,T,S] fp32 scores.

  Laid out as the model's attention always was (kv head ahead of the key
  axis, result transposed at the end), which XLA:CPU runs fastest.
  """
  b, t, h, hd = q_bthd.shape
  kvh, dt = k_bskd.shape[2], q_bthd.dtype
  qg = q_bthd.reshape(b, t, kvh, h // kvh, hd)
  keys, vals = k_bskd.transpose(0, 2, 1, 3), v_bskd.transpose(0, 2, 1, 3)
  logits = jnp.einsum("btgrk,bgsk->bgrts", qg, keys,
                      preferred_element_type=jnp.float32) / jnp.sqrt(hd).astype(jnp.float32)
  idx = jnp.arange(t)
  mask = (idx[None, :] <= idx[:, None])[None]  # [1,T,S]
  if segment_ids_bt is not None:
    mask = mask & (segment_ids_bt[:, None, :] == segment_ids_bt[:, :, None])
  logits = jnp.where(mask[:, None, None], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  out = jnp.einsum("bgrts,bgsk->bgrtk", probs, vals, preferred_element_type=jnp.float32)
  return out.astype(dt).transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


# ------------------------------------------------------------------ blockwise

def blockwise_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt=None, *, block_q=512, block_kv=512):
  """Flash attention in plain JAX: never holds more than [B,H,block_q,block_kv] scores."""
  b, t, h, hd = q_bthd.shape
  kvh = k_bskd.shape[2]
  bq, bkv = min(block_q, t), min(block_kv, t)
  tq, tk = -(-t // bq) * bq, -(-t // bkv) * bkv
  # Internal layout: q [B,KV,R,T,hd], k/v [B,KV,S,hd] (kv head ahead of time:
  # every block product is a plain batched matmul).
  q5 = q_bthd.reshape(b, t, kvh, h // kvh, hd).transpose(0, 2, 3, 1, 4)
  k4, v4 = k_bskd.transpose(0, 2, 1, 3), v_bskd.transpose(0, 2, 1, 3)
  q5 = jnp.pad(q5, [(0, 0)] * 3 + [(0, tq - t), (0, 0)])
  k4 = jnp.pad(k4, [(0, 0)] * 2 + [(0, tk - t), (0, 0)])
  v4 = jnp.pad(v4, [(0, 0)] * 2 + [(0, tk - t), (0, 0)])
  seg_q = seg_k = None
  if segment_ids_bt is not None:
    # Padded positions sit after every real one, so causality already hides
    # them from real queries; their id is irrelevant.
    seg = segment_ids_bt.astype(jnp.int32)
    seg_q = jnp.pad(seg, [(0, 0), (0, tq - t)], constant_values=-1)
    seg_k = jnp.pad(seg, [(0, 0), (0, tk - t)], constant_values=-1)
  out5 = _flash(q5, k4, v4, seg_q, seg_k, 1.0 / math.sqrt(hd), bq, bkv)
  return out5[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def _block_mask(i, j, bq, bkv, seg_q, seg_k):
  """[B|1, 1, 1, bq, bkv] visibility of kv block j from q block i."""
  q_idx = i * bq + jnp.arange(bq)
  k_idx = j * bkv + jnp.arange(bkv)
  mask = (k_idx[None, :] <= q_idx[:, None])[None]
  if seg_q is not None:
    sq = lax.dynamic_slice_in_dim(seg_q, i * bq, bq, axis=1)
    sk = lax.dynamic_slice_in_dim(seg_k, j * bkv, bkv, axis=1)
    mask = mask & (sq[:, :, None] == sk[:, None, :])
  return mask[:, None, None]


def _kv_blocks_seen(i, bq, bkv, nk):
  """How many kv blocks (from 0) q block i can see: the rest are above the diagonal."""
  return jnp.minimum(nk, ((i + 1) * bq - 1) // bkv + 1)


def _first_q_block_seeing(j, bq, bkv):
  return (j * bkv) // bq


def _scores(qi, kj, scale):
  return jnp.einsum("bgrqd,bgkd->bgrqk", qi, kj, preferred_element_type=jnp.float32) * scale


def _flash_fwd_impl(q5, k4, v4, seg_q, seg_k, scale, bq, bkv):
  b, g, r, tq, hd = q5.shape
  nq, nk = tq // bq, k4.shape[2] // bkv

  def q_block(i):
    qi = lax.dynamic_slice_in_dim(q5, i * bq, bq, axis=3)

    def kv_step(j, carry):
      m, l, acc = carry
      kj = lax.dynamic_slice_in_dim(k4, j * bkv, bkv, axis=2)
      vj = lax.dynamic_slice_in_dim(v4, j * bkv, bkv, axis=2)
      mask = _block_mask(i, j, bq, bkv, seg_q, seg_k)
      s = jnp.where(mask, _scores(qi, kj, scale), _NEG)
      m_new = jnp.maximum(m, s.max(-1))
      # Masked entries are zeroed explicitly (not just by exp(-huge)): a row
      # with nothing visible yet has m_new == _NEG and would weigh them 1.
      p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
      alpha = jnp.exp(m - m_new)
      l = l * alpha + p.sum(-1)
      pv = jnp.einsum("bgrqk,bgkd->bgrqd", p.astype(v4.dtype), vj, preferred_element_type=jnp.float32)
      return m_new, l, acc * alpha[..., None] + pv

    init = (jnp.full((b, g, r, bq), _NEG, jnp.float32), jnp.zeros((b, g, r, bq), jnp.float32),
            jnp.zeros((b, g, r, bq, hd), jnp.float32))
    m, l, acc = lax.fori_loop(0, _kv_blocks_seen(i, bq, bkv, nk), kv_step, init)
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)[..., None]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    return out.astype(q5.dtype), lse

  out, lse = lax.map(q_block, jnp.arange(nq))  # [nq,B,G,R,bq,...]
  out = jnp.moveaxis(out, 0, 3).reshape(b, g, r, tq, hd)
  lse = jnp.moveaxis(lse, 0, 3).reshape(b, g, r, tq)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q5, k4, v4, seg_q, seg_k, scale, bq, bkv):
  return _flash_fwd_impl(q5, k4, v4, seg_q, seg_k, scale, bq, bkv)[0]


def _flash_fwd(q5, k4, v4, seg_q, seg_k, scale, bq, bkv):
  out, lse = _flash_fwd_impl(q5, k4, v4, seg_q, seg_k, scale, bq, bkv)
  return out, (q5, k4, v4, seg_q, seg_k, out, lse)


def _flash_bwd(scale, bq, bkv, res, do5):
  """Two passes like FlashAttention-2: dq per q block, then dk/dv per kv block.

  Each recomputes the block's probabilities as exp(s - lse); with
  delta = rowsum(do * out), ds = p * (do v^T - delta).
  """
  q5, k4, v4, seg_q, seg_k, out, lse = res
  b, g, r, tq, hd = q5.shape
  tk = k4.shape[2]
  nq, nk = tq // bq, tk // bkv
  delta = jnp.sum(do5.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B,G,R,Tq]

  def q_slices(i):
    sl = functools.partial(lax.dynamic_slice_in_dim, start_index=i * bq, slice_size=bq, axis=3)
    return sl(q5), sl(do5), sl(lse[..., None])[..., 0], sl(delta[..., None])[..., 0]

  def probs_and_ds(i, j, qi, doi, lse_i, delta_i, kj, vj):
    mask = _block_mask(i, j, bq, bkv, seg_q, seg_k)
    p = jnp.where(mask, jnp.exp(_scores(qi, kj, scale) - lse_i[..., None]), 0.0)
    dp = jnp.einsum("bgrqd,bgkd->bgrqk", doi, vj, preferred_element_type=jnp.float32)
    return p, p * (dp - delta_i[..., None])

  def dq_block(i):
    qi, doi, lse_i, delta_i = q_slices(i)

    def kv_step(j, dq):
      kj = lax.dynamic_slice_in_dim(k4, j * bkv, bkv, axis=2)
      vj = lax.dynamic_slice_in_dim(v4, j * bkv, bkv, axis=2)
      _, ds = probs_and_ds(i, j, qi, doi, lse_i, delta_i, kj, vj)
      return dq + jnp.einsum("bgrqk,bgkd->bgrqd", ds.astype(k4.dtype), kj, preferred_element_type=jnp.float32)

    dq = lax.fori_loop(0, _kv_blocks_seen(i, bq, bkv, nk), kv_step,
                       jnp.zeros((b, g, r, bq, hd), jnp.float32))
    return (dq * scale).astype(q5.dtype)

  def dkv_block(j):
    kj = lax.dynamic_slice_in_dim(k4, j * bkv, bkv, axis=2)
    vj = lax.dynamic_slice_in_dim(v4, j * bkv, bkv, axis=2)

    def q_step(i, carry):
      dk, dv = carry
      qi, doi, lse_i, delta_i = q_slices(i)
      p, ds = probs_and_ds(i, j, qi, doi, lse_i, delta_i, kj, vj)
      dv = dv + jnp.einsum("bgrqk,bgrqd->bgkd", p.astype(do5.dtype), doi, preferred_element_type=jnp.float32)
      dk = dk + jnp.einsum("bgrqk,bgrqd->bgkd", ds.astype(q5.dtype), qi, preferred_element_type=jnp.float32)
      return dk, dv

    zeros = jnp.zeros((b, g, bkv, hd), jnp.float32)
    dk, dv = lax.fori_loop(_first_q_block_seeing(j, bq, bkv), nq, q_step, (zeros, zeros))
    return (dk * scale).astype(k4.dtype), dv.astype(v4.dtype)

  dq = jnp.moveaxis(lax.map(dq_block, jnp.arange(nq)), 0, 3).reshape(q5.shape)
  dk, dv = lax.map(dkv_block, jnp.arange(nk))
  dk = jnp.moveaxis(dk, 0, 2).reshape(k4.shape)
  dv = jnp.moveaxis(dv, 0, 2).reshape(v4.shape)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ------------------------------------------------------------------ splash

@functools.lru_cache(maxsize=64)
def _splash_kernel(h: int, t: int, bq: int, bkv: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  mask = sa.MultiHeadMask([sa.CausalMask((t, t)) for _ in range(h)])
  sizes = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                        block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  # The kernel holds its block-sparsity tables as arrays; built while tracing
  # they would be the trace's (newer JAX), and the cache would leak them.
  with jax.ensure_compile_time_eval():
    return sa.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_attention(q_bthd, k_bskd, v_bskd, segment_ids_bt=None, *, block_q=512, block_kv=512,
                     interpret=False):
  """Pallas splash attention, vmapped over the batch; GQA is native to its MHA kernel.

  Splash wants per-example [H,T,hd], q pre-scaled, and T a multiple of both
  block sizes (themselves multiples of 128 on TPU): T is right-padded.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  b, t, h, hd = q_bthd.shape
  bq = min(block_q, _round_up(t, 128))
  bkv = min(block_kv, _round_up(t, 128))
  tp = _round_up(t, bq * bkv // math.gcd(bq, bkv))
  pad = [(0, 0), (0, tp - t), (0, 0), (0, 0)]
  scale = 1.0 / math.sqrt(hd)
  q = jnp.pad((q_bthd.astype(jnp.float32) * scale).astype(q_bthd.dtype), pad).transpose(0, 2, 1, 3)
  k = jnp.pad(k_bskd, pad).transpose(0, 2, 1, 3)
  v = jnp.pad(v_bskd, pad).transpose(0, 2, 1, 3)
  kernel = _splash_kernel(h, tp, bq, bkv, interpret)
  if segment_ids_bt is None:
    out = jax.vmap(kernel)(q, k, v)
  else:
    seg = jnp.pad(segment_ids_bt.astype(jnp.int32), [(0, 0), (0, tp - t)], constant_values=-1)
    out = jax.vmap(lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=sa.SegmentIds(q=s1, kv=s1)))(
        q, k, v, seg)
  return out.transpose(0, 2, 1, 3)[:, :t].astype(q_bthd.dtype)
