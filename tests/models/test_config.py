"""ModelConfig validation and its parameter count."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer


@pytest.mark.parametrize("overrides,field", [
    (dict(dim=0), "ModelConfig.dim"),
    (dict(n_layers=-1), "ModelConfig.n_layers"),
    (dict(n_heads=6, n_kv_heads=4), "ModelConfig.n_kv_heads"),
    (dict(head_dim=7), "ModelConfig.head_dim"),
    (dict(dtype="float64"), "ModelConfig.dtype"),
    (dict(param_dtype="int8"), "ModelConfig.param_dtype"),
    (dict(remat="all"), "ModelConfig.remat"),
])
def test_invalid_fields_are_named(overrides, field):
  with pytest.raises(ValueError, match=field):
    ModelConfig(**overrides)


def test_from_dict_names_unknown_fields():
  assert ModelConfig.from_dict({"dim": 64, "mlp_dim": 96}) == ModelConfig(dim=64, mlp_dim=96)
  with pytest.raises(ValueError, match="hidden_size"):
    ModelConfig.from_dict({"hidden_size": 64})


@pytest.mark.parametrize("qkv_bias,tie,scan", [(False, True, False), (True, False, False), (True, False, True)])
def test_num_params_matches_the_built_model(qkv_bias, tie, scan):
  cfg = dataclasses.replace(ModelConfig(vocab_size=50, dim=24, n_layers=3, n_heads=4, n_kv_heads=2,
                                        head_dim=6, mlp_dim=40), qkv_bias=qkv_bias, tie_embeddings=tie,
                            scan_layers=scan)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  sizes = [int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))]
  assert sum(sizes) == cfg.num_params()
