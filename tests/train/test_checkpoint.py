"""Checkpoints round-trip exactly and restore onto a different mesh."""
import jax
import numpy as np
import optax
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel.mesh import make_mesh
from mtrl_jax.parallel.rules import get_rules
from mtrl_jax.parallel.sharded_init import create_sharded, state_shardings
from mtrl_jax.parallel.sharded_step import init_opt_state, opt_state_shardings
from mtrl_jax.train.checkpoint import Checkpointer

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


def _state(mesh, rules, seed):
  model = create_sharded(lambda: Transformer(CFG, rngs=nnx.Rngs(seed)), mesh, rules)
  _, params = nnx.split(model)
  tx = optax.adamw(1e-3)
  p_sh = state_shardings(params, mesh, rules)
  opt = init_opt_state(tx, params, opt_state_shardings(tx, params, p_sh, mesh))
  return {"policy": params, "opt_policy": opt}


def test_restore_onto_another_mesh(tmp_path):
  rules = get_rules("default")
  saved = _state(make_mesh((8, 1, 1)), rules, seed=0)
  ck = Checkpointer(str(tmp_path), keep=2, async_save=True)
  ck.save(1, saved, {"stage": "rl", "stage_step": 4})
  ck.wait()
  assert ck.restore_meta() == {"stage": "rl", "stage_step": 4}

  # A different mesh (and different initial values, to see they are replaced).
  other = make_mesh((2, 2, 2))
  target = _state(other, rules, seed=1)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
  restored, meta = ck.restore(abstract)
  ck.close()
  assert meta["stage_step"] == 4
  flat_s, flat_r, flat_t = (jax.tree.leaves(t) for t in (saved, restored, target))
  assert len(flat_s) == len(flat_r)
  for s, r, t in zip(flat_s, flat_r, flat_t):
    np.testing.assert_array_equal(np.asarray(s), np.asarray(r))
    assert r.sharding == t.sharding  # laid out for the new mesh
  wq = restored["policy"]["layers"][0]["attn"]["wq"]
  assert wq.get_value().sharding.spec == target["policy"]["layers"][0]["attn"]["wq"].get_value().sharding.spec


def test_no_checkpoint_is_an_error_naming_the_folder(tmp_path):
  ck = Checkpointer(str(tmp_path))
  assert ck.latest_step() is None and ck.restore_meta() is None
  try:
    ck.restore({})
  except FileNotFoundError as e:
    assert "checkpoints" in str(e)
  else:
    raise AssertionError("restore without a checkpoint must fail")
  finally:
    ck.close()
