"""Parameters created already sharded, equal to an unsharded init; rule problems named."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.layers import _param
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel import create_sharded, get_rules, make_mesh, state_shardings

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


def _factory():
  return Transformer(CFG, rngs=nnx.Rngs(0))


def test_weights_are_sharded_and_equal_unsharded_init():
  mesh, rules = make_mesh((1, 4, 2)), get_rules("default")
  model = create_sharded(_factory, mesh, rules)
  wq = model.layers[0].attn.wq[...]
  assert wq.sharding.spec == P("fsdp", "tensor", None)
  assert {s.data.shape for s in wq.addressable_shards} == {(32 // 4, 4 // 2, 8)}
  assert model.embed[...].sharding.spec == P("tensor", "fsdp")
  assert model.layers[1].mlp.w_down[...].sharding.spec == P("tensor", "fsdp")
  plain = _factory()
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(plain)), strict=True):
    # Same random bits; the jitted normal transform may round the last bit differently.
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


def test_fsdp_preset_shards_only_over_fsdp():
  model = create_sharded(_factory, make_mesh((2, 4, 1)), get_rules("fsdp"))
  assert model.layers[0].attn.wq[...].sharding.spec == P("fsdp", None, None)
  assert model.embed[...].sharding.spec == P(None, "fsdp")
  assert {s.data.shape for s in model.embed[...].addressable_shards} == {(264, 8)}


def test_indivisible_dimension_is_replicated_with_a_warning(caplog):
  mesh = make_mesh((1, 1, 8))  # 4 heads, 2 kv heads cannot split 8 ways; mlp 64 and vocab 264 can
  with caplog.at_level(logging.WARNING, logger="mtrl_jax.parallel.sharded_init"):
    model = create_sharded(_factory, mesh, get_rules("default"))
  assert model.layers[0].attn.wq[...].sharding.spec == P("fsdp", None, None)
  assert model.layers[0].mlp.w_up[...].sharding.spec == P("fsdp", "tensor")
  assert any("layers/0/attn/wq" in r.message and "'heads'" in r.message for r in caplog.records)


def test_indivisible_dimension_strict_names_param_and_axis():
  with pytest.raises(ValueError, match=r"parameter layers/0/attn/wk: dimension 1 \('kv_heads', size 2\).*"
                                       r"\('tensor',\) \(size 8\)"):
    create_sharded(_factory, make_mesh((1, 1, 8)), get_rules("default"), strict=True)


class _Experts(nnx.Module):
  def __init__(self, rngs):
    self.w = _param(rngs, nnx.initializers.normal(0.02), (4, 32), ("experts", "embed"), jnp.float32)


def test_param_with_unmapped_logical_name_is_named():
  with pytest.raises(ValueError, match="parameter w: logical axis 'experts' has no rule"):
    create_sharded(lambda: _Experts(nnx.Rngs(0)), make_mesh((1, 8, 1)), get_rules("default"))


def test_one_mesh_axis_on_two_dims_is_named():
  rules = get_rules("default", {"vocab": "fsdp"})  # embed [vocab, embed] would use fsdp twice
  with pytest.raises(ValueError, match="parameter embed: mesh axis 'fsdp' is used by both"):
    create_sharded(_factory, make_mesh((1, 8, 1)), rules)
  with pytest.raises(ValueError, match="parameter embed: mesh axis 'fsdp' is used by both"):
    state_shardings(nnx.state(nnx.eval_shape(_factory)), make_mesh((1, 8, 1)), rules)
