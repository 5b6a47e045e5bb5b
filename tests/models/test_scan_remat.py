"""Scanned blocks (ModelConfig.scan_layers) and remat (ModelConfig.remat).

Both are changes of program, not of function: the same weights must give the
same logits, gradients, cached decoding and critic values in either block
layout and under every remat policy, while the scanned program's size stays
flat in depth and remat saves fewer residuals.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mtrl_jax.models import layout
from mtrl_jax.models.config import REMAT_POLICIES, ModelConfig
from mtrl_jax.models.transformer import Transformer, token_logprobs, with_layout
from mtrl_jax.models.value import Critic, copy_trunk

CFG = ModelConfig(vocab_size=61, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                  qkv_bias=True, tie_embeddings=False)
SCAN = dataclasses.replace(CFG, scan_layers=True)


def filled(factory, seed: int = 0) -> nnx.Module:
  """factory()'s module built abstractly, every weight drawn large on the host
  (norm scales around 1, biases nonzero): each layer then changes the logits
  by O(1), so a wrong layer order or a skipped layer is far outside the
  tolerances. No random-init programs are compiled (slow on CPU)."""
  graphdef, state = nnx.split(nnx.eval_shape(factory))
  rng = np.random.default_rng(seed)
  flat = []
  for path, var in nnx.to_flat_state(state):
    noise = rng.standard_normal(var.get_value().shape).astype(np.float32)
    flat.append((path, var.replace(jnp.asarray(1.0 + 0.2 * noise if path[-1] == "scale" else 0.25 * noise))))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def with_cfg(model: Transformer, cfg: ModelConfig) -> Transformer:
  """`model`'s weights under another config of the same layout (e.g. a remat policy)."""
  graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  return nnx.merge(graphdef, nnx.state(model))


@functools.lru_cache(maxsize=None)
def _apply(graphdef):
  """One jitted forward per module structure (a fresh jit per call would recompile)."""
  return jax.jit(lambda state, tok: nnx.merge(graphdef, state)(tok))


def tokens(b=2, t=11, seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, (b, t)), jnp.int32)


def jitted_logits(model, tok):
  graphdef, state = nnx.split(model)
  return np.asarray(_apply(graphdef)(state, tok)[0])


def loss_and_grads(model, tok):
  """Grads of the mean next-token log-prob, as an unrolled flat dict (both layouts comparable)."""
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params):
    logits, _ = nnx.merge(graphdef, params)(tok[:, :-1])
    return -jnp.mean(token_logprobs(logits, tok[:, 1:]))

  val, grads = jax.jit(jax.value_and_grad(loss))(params)
  flat = layout.unstack_flat(nnx.to_flat_state(grads))
  return float(val), {p: np.asarray(v.get_value()) for p, v in flat}


@pytest.fixture(scope="module")
def unrolled():
  return filled(lambda: Transformer(CFG, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="module")
def scanned(unrolled):
  return with_layout(unrolled, True)


# ---- layout ----------------------------------------------------------------

def test_scanned_init_stacks_the_unrolled_init_in_layer_order():
  """A seed gives the same weights in both layouts: row i of each stacked
  parameter is layer i. Catches a reversed or shuffled stacking order."""
  u, s = Transformer(CFG, rngs=nnx.Rngs(3)), Transformer(SCAN, rngs=nnx.Rngs(3))
  assert s.layers.attn.wq[...].shape == (CFG.n_layers, CFG.dim, CFG.n_heads, CFG.head_dim)
  assert s.layers.attn.wq.get_metadata()["out_sharding"] == ("layers", "embed", "heads", "head_dim")
  for i in range(CFG.n_layers):
    np.testing.assert_array_equal(s.layers.attn.wq[...][i], u.layers[i].attn.wq[...])
    np.testing.assert_array_equal(s.layers.mlp.w_down[...][i], u.layers[i].mlp.w_down[...])
  np.testing.assert_array_equal(s.embed[...], u.embed[...])
  np.testing.assert_array_equal(s.lm_head[...], u.lm_head[...])


def test_layout_conversion_round_trips_exactly(unrolled, scanned):
  """unrolled -> scanned -> unrolled gives back every array bit for bit, in
  order; the scanned rows are the layers. Catches a reversed stack/unstack."""
  back = with_layout(scanned, False)
  a = dict(nnx.to_flat_state(nnx.state(unrolled)))
  b = dict(nnx.to_flat_state(nnx.state(back)))
  assert a.keys() == b.keys()
  for p in a:
    np.testing.assert_array_equal(np.asarray(a[p].get_value()), np.asarray(b[p].get_value()))
  np.testing.assert_array_equal(scanned.layers.mlp.w_up[...][2], unrolled.layers[2].mlp.w_up[...])
  assert layout.is_scanned(nnx.to_flat_state(nnx.state(scanned))) is True
  assert layout.is_scanned(nnx.to_flat_state(nnx.state(back))) is False


def test_same_logits_in_both_layouts(unrolled, scanned):
  """Catches a scan that skips, repeats or reorders a layer (each layer moves
  the logits by O(1) with these weights)."""
  tok = tokens()
  lu, ls = jitted_logits(unrolled, tok), jitted_logits(scanned, tok)
  assert np.abs(lu).max() > 1.0
  np.testing.assert_allclose(ls, lu, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def base_grads(unrolled):
  """(loss, grads) without remat, per layout (scan_layers: False/True)."""
  tok = tokens(t=12)
  return {scan: loss_and_grads(with_layout(unrolled, scan), tok) for scan in (False, True)}


def test_same_gradients_in_both_layouts(base_grads):
  (lu, gu), (ls, gs) = base_grads[False], base_grads[True]
  assert gu.keys() == gs.keys()
  np.testing.assert_allclose(ls, lu, rtol=1e-6)
  for p in gu:
    scale = np.abs(gu[p]).max()
    assert scale > 0, p
    np.testing.assert_allclose(gs[p], gu[p], rtol=1e-4, atol=1e-5 * scale, err_msg=str(p))


@pytest.mark.parametrize("scan", [False, True])
def test_remat_gives_the_same_gradients(unrolled, base_grads, scan):
  """Remat recomputes the same fp32 arithmetic: under every policy the
  gradients agree tightly with no remat, in both layouts."""
  tok = tokens(t=12)
  base = with_layout(unrolled, scan)
  l0, g0 = base_grads[scan]
  for remat in REMAT_POLICIES[1:]:
    l1, g1 = loss_and_grads(with_cfg(base, dataclasses.replace(base.cfg, remat=remat)), tok)
    np.testing.assert_allclose(l1, l0, rtol=1e-6, err_msg=remat)
    for p in g0:
      np.testing.assert_allclose(g1[p], g0[p], rtol=1e-4, atol=1e-5 * np.abs(g0[p]).max(),
                                 err_msg=f"{remat} {p}")


def _residual_bytes(model, tok) -> int:
  """Bytes the backward keeps from the forward, beyond the weights: the
  arrays held by the VJP closure, found abstractly (nothing runs)."""
  graphdef, params = nnx.split(model, nnx.Param)
  vjp = jax.eval_shape(lambda p: jax.vjp(lambda q: nnx.merge(graphdef, q)(tok)[0], p)[1], params)
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp)) - param_bytes


@pytest.mark.parametrize("scan", [False, True])
def test_remat_saves_fewer_residuals(unrolled, scan):
  """Remat must actually change what is stored: with "full" the backward keeps
  much less than without remat, "dots_no_batch" in between. Catches a remat
  setting that is ignored (e.g. `_block_step` never wrapping in jax.checkpoint)."""
  tok = tokens(b=4, t=32)
  base = with_layout(unrolled, scan)
  sizes = {r: _residual_bytes(with_cfg(base, dataclasses.replace(base.cfg, remat=r)), tok)
           for r in ("none", "full", "dots_no_batch")}
  assert sizes["full"] < 0.5 * sizes["none"], sizes
  assert sizes["full"] < sizes["dots_no_batch"] < sizes["none"], sizes


def _count_eqns(jaxpr) -> int:
  n = 0
  for eqn in jaxpr.eqns:
    n += 1
    for sub in jax.core.jaxprs_in_params(eqn.params):
      n += _count_eqns(sub)
  return n


def _program_size(cfg: ModelConfig) -> int:
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params, tok):
    return jnp.sum(nnx.merge(graphdef, params)(tok)[0])

  tok = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  return _count_eqns(jax.make_jaxpr(jax.grad(loss))(params, tok).jaxpr)


def test_scanned_program_does_not_grow_with_depth():
  """What XLA compiles: the scanned forward+backward has the same number of
  operations at 2 and 12 layers, the unrolled one grows ~linearly. (A
  wall-clock compile time would be flaky on a shared CPU; the report has
  measured seconds.) Catches scanning that still traces a block per layer."""
  small = dataclasses.replace(CFG, n_layers=2)
  deep = dataclasses.replace(CFG, n_layers=12)
  scan_small, scan_deep = (_program_size(dataclasses.replace(c, scan_layers=True)) for c in (small, deep))
  unroll_small, unroll_deep = _program_size(small), _program_size(deep)
  assert scan_small == scan_deep
  assert unroll_deep > 4 * unroll_small


def test_remat_name_is_validated():
  with pytest.raises(ValueError, match="ModelConfig.remat"):
    ModelConfig(remat="everything")
  with pytest.raises(ValueError, match="ModelConfig.scan_layers"):
    ModelConfig(scan_layers="yes")


# ---- cache, critic ------------------------------------------------------------

def _cached_run(model, tok):
  """Prefill 5 tokens, then 4 single-token appends (row 1 idle): each step's
  logits and the final cache, in one jitted call."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tok):
    m = nnx.merge(graphdef, state)
    logits, cache = m(tok[:, :5], m.init_cache(2, 16))
    steps = [logits[:, -1]]
    for t in range(5, 9):
      logits, cache = m(tok[:, t:t + 1], cache, jnp.array([1, 0], jnp.int32))
      steps.append(logits[:, -1])
    return jnp.stack(steps, 1), cache

  return run(state, tok)


def test_cached_decoding_matches_in_both_layouts(unrolled, scanned):
  """Prefill then token-by-token appends: the stacked cache [L, B, KV, S, hd]
  of the scanned model holds the same keys as the unrolled tuple, and the
  logits of every step agree."""
  tok = tokens(b=2, t=9, seed=4)
  cs0 = scanned.init_cache(2, 16)
  assert cs0.k.shape == (CFG.n_layers, 2, CFG.n_kv_heads, 16, CFG.head_dim)
  assert cs0.capacity == unrolled.init_cache(2, 16).capacity == 16
  lu, cu = _cached_run(unrolled, tok)
  ls, cs = _cached_run(scanned, tok)
  np.testing.assert_allclose(ls[0], lu[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ls[1, 0], lu[1, 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(cs.length_b, [9, 5])
  for i in range(CFG.n_layers):
    np.testing.assert_allclose(cs.k[i], cu.k[i], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cs.v[i], cu.v[i], rtol=1e-5, atol=1e-5)


def jitted_values(critic, tok):
  graphdef, state = nnx.split(critic)
  return np.asarray(_apply(graphdef)(state, tok))


def test_critic_in_both_layouts_and_across(unrolled, scanned):
  """A scanned critic gives the values of an unrolled one with the same
  weights; copy_trunk (what Critic.from_policy uses) converts when policy and
  critic layouts differ. Catches copy_trunk matching paths of one layout only."""
  tok = tokens(b=2, t=10, seed=5)
  head_w = jnp.linspace(-1.0, 1.0, CFG.dim)
  values = {}
  for src_name, src in (("unrolled", unrolled), ("scanned", scanned)):
    for dst_cfg in (CFG, SCAN):
      critic = filled(lambda dst_cfg=dst_cfg: Critic(dst_cfg, rngs=nnx.Rngs(7)), seed=7)
      copy_trunk(src, critic.trunk)
      critic.head.w[...] = head_w
      critic.head.b[...] = jnp.float32(0.3)
      values[src_name, dst_cfg.scan_layers] = jitted_values(critic, tok)
  want = values["unrolled", False]
  assert np.abs(want).max() > 0.1
  for key, got in values.items():
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(key))


# ---- checkpoint, sharding ----------------------------------------------------

def test_checkpoint_round_trip_of_a_scanned_model(tmp_path, scanned):
  """Orbax saves the stacked arrays and restores them bit for bit into a
  scanned model built from a different seed."""
  from mtrl_jax.train.checkpoint import Checkpointer, abstract_like
  ck = Checkpointer(str(tmp_path), async_save=False)
  ck.save(1, {"policy": nnx.state(scanned)}, {"stage": "rl"})
  ck.wait()
  target = filled(lambda: Transformer(SCAN, rngs=nnx.Rngs(9)), seed=9)
  restored, meta = ck.restore(abstract_like({"policy": nnx.state(target)}))
  ck.close()
  assert meta["stage"] == "rl"
  nnx.update(target, restored["policy"])
  np.testing.assert_array_equal(target.layers.attn.wk[...], scanned.layers.attn.wk[...])
  tok = tokens()
  np.testing.assert_array_equal(jitted_logits(target, tok), jitted_logits(scanned, tok))


def test_sharded_init_of_a_scanned_model():
  """On 8 fake devices the stacked weights keep the layer axis whole and
  shard the rest as an unrolled block would; values equal an unsharded init."""
  from mtrl_jax.parallel import activation_rules, create_sharded, get_rules, make_mesh
  cfg = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64,
                    scan_layers=True)
  mesh, rules = make_mesh((1, 4, 2)), get_rules("default")
  model = create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh, rules)
  wq = model.layers.attn.wq[...]
  assert wq.sharding.spec == P(None, "fsdp", "tensor", None)
  assert {s.data.shape for s in wq.addressable_shards} == {(2, 32 // 4, 4 // 2, 8)}
  assert model.layers.mlp.w_down[...].sharding.spec == P(None, "tensor", "fsdp")
  plain = Transformer(cfg, rngs=nnx.Rngs(0))
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(plain)), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)
  # ... and it runs sharded, giving the unsharded logits.
  tok = tokens(b=8, t=6)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(activation_rules(rules)):
    sharded_logits = jitted_logits(model, tok)
  np.testing.assert_allclose(sharded_logits, jitted_logits(plain, tok), rtol=1e-5, atol=1e-5)
