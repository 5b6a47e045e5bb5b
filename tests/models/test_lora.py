"""LoRA adapters (models/lora.py): a no-op at step 0, the right low-rank update after.

The oracle for an adapted model is the same model without adapters whose
weights are W + (alpha / rank) A B, merged here in numpy (not with
`lora.merged`, which is itself under test).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax import config as config_lib
from mtrl_jax.models import layout, lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer, with_layout
from mtrl_jax.models.value import Critic, copy_trunk

BASE = ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
                   qkv_bias=True, tie_embeddings=False)
RANK, ALPHA = 4, 12.0


def adapted(cfg: ModelConfig, **kw) -> ModelConfig:
  return dataclasses.replace(cfg, lora=lora.LoraConfig(rank=RANK, alpha=ALPHA, **kw))


@functools.lru_cache(maxsize=None)
def _forward(graphdef):
  return jax.jit(lambda state, tok: nnx.merge(graphdef, state)(tok)[0])


def logits(model, tok):
  graphdef, state = nnx.split(model)
  return np.asarray(_forward(graphdef)(state, tok))


def tokens(b=2, t=9, seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(0, BASE.vocab_size, (b, t)), jnp.int32)


def flat_params(state) -> dict:
  return {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def with_random_b(model, seed=3, scale=0.3):
  """The model with every B drawn large (the adapters then change the outputs by O(1))."""
  rng = np.random.default_rng(seed)
  state = nnx.state(model, lora.ADAPTER)
  flat = []
  for path, var in nnx.to_flat_state(state):
    if str(path[-1]).endswith(lora.B_SUFFIX):
      var = var.replace(jnp.asarray(scale * rng.standard_normal(var.get_value().shape), var.get_value().dtype))
    flat.append((path, var))
  nnx.update(model, nnx.from_flat_state(flat))
  return model


def numpy_merged_state(model) -> nnx.State:
  """The base state with W + (alpha / rank) * A B for each adapted weight, in numpy (unrolled layout)."""
  flat = flat_params(nnx.state(model, nnx.Param))
  out = []
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    path = tuple(path)
    if isinstance(var, nnx.LoRAParam):
      continue
    a = flat.get(path[:-1] + (path[-1] + "_lora_a",))
    if a is not None:
      b = flat[path[:-1] + (path[-1] + "_lora_b",)]
      w = np.asarray(var.get_value(), np.float64)
      a2 = a.reshape(-1, RANK).astype(np.float64)  # [in, r]
      b2 = b.reshape(RANK, -1).astype(np.float64)  # [r, out]
      var = var.replace(jnp.asarray((w + ALPHA / RANK * (a2 @ b2).reshape(w.shape)).astype(np.float32)))
    out.append((path, var))
  return nnx.from_flat_state(out)


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("dtype, tied", [("float32", False), ("bfloat16", True)])
def test_fresh_adapters_change_nothing_bit_for_bit(scan, dtype, tied):
  """A seed gives the same base weights with and without adapters, and the
  adapted model's logits equal the base model's exactly (training forward and
  cached decoding), in both layouts and in bf16.

  Break checked: B drawn like A (he-uniform instead of zeros) makes the logits
  differ; the adapters' key drawn from the params stream before the base
  weights (instead of after all of them) makes the base weights differ.
  """
  cfg = dataclasses.replace(BASE, scan_layers=scan, dtype=dtype, tie_embeddings=tied)
  base = Transformer(cfg, rngs=nnx.Rngs(5))
  model = Transformer(adapted(cfg), rngs=nnx.Rngs(5))
  got_base = flat_params(lora.base(nnx.state(model)))
  want = flat_params(nnx.state(base))
  assert got_base.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got_base[k], want[k], err_msg=str(k))
  # A is drawn (nonzero), B is zero.
  for path, value in flat_params(nnx.state(model, lora.ADAPTER)).items():
    assert (np.abs(value).max() > 0) == str(path[-1]).endswith(lora.A_SUFFIX), path
  tok = tokens()
  np.testing.assert_array_equal(logits(model, tok), logits(base, tok))
  # Cached decoding: a prefill then one more token.
  def decode(m):
    cache = m.init_cache(2, 16)
    a, cache = m(tok[:, :5], cache)
    b, _ = m(tok[:, 5:6], cache)
    return np.asarray(a), np.asarray(b)
  for x, y in zip(decode(model), decode(base)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("scan", [False, True])
def test_adapted_forward_equals_the_merged_weights_oracle(scan):
  """With B nonzero the adapted model computes what the base model does with
  W + (alpha / rank) A B (numpy merge), for every target weight.

  The adapters move the logits by O(1) (asserted), against a 1e-4 tolerance.
  Break checked: scale alpha instead of alpha / rank fails the comparison.
  """
  cfg = dataclasses.replace(BASE, scan_layers=scan)
  model = with_random_b(Transformer(adapted(cfg), rngs=nnx.Rngs(0)))
  unrolled = model if not scan else with_layout(model, False)
  base_cfg = dataclasses.replace(BASE, scan_layers=False)
  gd = nnx.split(nnx.eval_shape(lambda: Transformer(base_cfg, rngs=nnx.Rngs(0))))[0]
  oracle = nnx.merge(gd, numpy_merged_state(unrolled))
  tok = tokens()
  got, want = logits(model, tok), logits(oracle, tok)
  base_logits = logits(nnx.merge(gd, lora.base(nnx.state(unrolled))), tok)
  assert np.abs(want - base_logits).max() > 0.5  # the adapters matter
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # lora.merged (what the sampler and the HF export use) gives the same weights.
  merged = flat_params(lora.merged(nnx.state(unrolled), unrolled.cfg.lora))
  for k, v in flat_params(numpy_merged_state(unrolled)).items():
    np.testing.assert_allclose(merged[k], v, rtol=1e-6, atol=1e-6, err_msg=str(k))


def test_merged_scanned_state_equals_merged_unrolled():
  model = with_random_b(Transformer(adapted(dataclasses.replace(BASE, scan_layers=True)), rngs=nnx.Rngs(0)))
  scanned = lora.merged(nnx.state(model), model.cfg.lora)
  unrolled = lora.merged(nnx.state(with_layout(model, False)), model.cfg.lora)
  a, b = flat_params(layout.to_unrolled(scanned)), flat_params(unrolled)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)


def test_adapter_gradients_equal_the_gradients_through_merged_weights():
  """d loss / d(A, B) of the adapted forward (x W + s x A B) equals the gradient
  through the merged weight W + s A B: two different programs, one function.

  Break checked: stop_gradient on A inside `lora.delta` (A gets no gradient)
  fails the comparison.
  """
  model = with_random_b(Transformer(adapted(BASE), rngs=nnx.Rngs(1)), scale=0.05)
  gd, ad, rest = nnx.split(model, lora.ADAPTER, ...)
  tok = tokens()
  base_gd = nnx.split(nnx.eval_shape(lambda: Transformer(BASE, rngs=nnx.Rngs(0))))[0]

  def loss_apply(ad):
    out, _ = nnx.merge(gd, ad, rest)(tok)
    return jnp.mean(jax.nn.log_softmax(out)[..., 3])

  def loss_merged(ad):
    state = lora.merged(nnx.merge_state(ad, rest), model.cfg.lora)
    out, _ = nnx.merge(base_gd, state)(tok)
    return jnp.mean(jax.nn.log_softmax(out)[..., 3])

  g1 = flat_params(jax.jit(jax.grad(loss_apply))(ad))  # jit: one compile, not one per op
  g2 = flat_params(jax.jit(jax.grad(loss_merged))(ad))
  assert max(np.abs(v).max() for v in g1.values()) > 1e-3
  for k in g1:
    np.testing.assert_allclose(g1[k], g2[k], rtol=2e-3, atol=1e-6, err_msg=str(k))


@pytest.mark.parametrize("targets, weights", [
    (("attn",), {"wq", "wk", "wv", "wo"}),
    (("mlp",), {"w_gate", "w_up", "w_down"}),
    ("q,down", {"wq", "w_down"}),
    (("all",), {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}),
])
def test_targets_pick_the_adapted_weights(targets, weights):
  cfg = adapted(BASE, targets=targets)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  flat = flat_params(nnx.state(model, lora.ADAPTER))
  got = {str(p[-1])[:-len(lora.A_SUFFIX)] for p in flat if str(p[-1]).endswith(lora.A_SUFFIX)}
  assert got == weights
  assert sum(v.size for v in flat.values()) == cfg.num_adapter_params()
  assert sum(v.size for v in flat_params(lora.base(nnx.state(model))).values()) == cfg.num_params()


@pytest.mark.parametrize("field, value, needle", [
    ("rank", -1, "lora.rank"), ("rank", 1.5, "lora.rank"), ("alpha", 0.0, "lora.alpha"),
    ("targets", ("q", "qq"), "lora.targets"), ("targets", (), "lora.targets"), ("sampler", "fuse", "lora.sampler"),
])
def test_bad_lora_fields_are_named(field, value, needle):
  with pytest.raises(ValueError, match=needle):
    ModelConfig(lora={"rank": 4, field: value} if field != "rank" else {"rank": value})


def test_config_validation_names_lora_fields():
  c = config_lib.base_config()
  c.model.lora.rank = -2
  with pytest.raises(ValueError, match="config.model: lora.rank"):
    config_lib.validate(c, num_devices=1)
  c = config_lib.base_config()
  c.critic.kind = "lora"
  with pytest.raises(ValueError, match="config.critic.lora.rank"):
    config_lib.validate(c, num_devices=1)
  c.model.lora.rank = 8  # the critic's adapters follow the policy's
  config_lib.validate(c, num_devices=1)
  assert config_lib.critic_lora(c).rank == 8
  c.critic.lora.update(rank=2, targets=("mlp",))
  assert (config_lib.critic_lora(c).rank, config_lib.critic_lora(c).targets) == (2, ("gate", "up", "down"))
  c.critic.lora.targets = ("x",)
  with pytest.raises(ValueError, match="config.critic.lora.targets"):
    config_lib.validate(c, num_devices=1)


def test_copy_trunk_folds_the_source_adapters_and_keeps_the_destination_ones():
  src = with_random_b(Transformer(adapted(BASE), rngs=nnx.Rngs(0)))
  critic = Critic(adapted(BASE), rngs=nnx.Rngs(1))
  own_before = flat_params(nnx.state(critic.trunk, lora.ADAPTER))
  copy_trunk(src, critic.trunk)
  merged = flat_params(numpy_merged_state(src))
  got = flat_params(lora.base(nnx.state(critic.trunk)))
  for k, v in got.items():
    np.testing.assert_allclose(v, merged[k], rtol=1e-6, atol=1e-7, err_msg=str(k))
  for k, v in flat_params(nnx.state(critic.trunk, lora.ADAPTER)).items():
    np.testing.assert_array_equal(v, own_before[k])
