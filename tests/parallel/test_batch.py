"""Batch placement over the batch axes and the divisibility check."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from mtrl_jax.parallel import (batch_sharding, check_batch_divisible, get_rules, make_mesh, process_batch_rows,
                               shard_batch)
from mtrl_jax.train.lm_step import LMBatch


def test_batch_sharding_splits_rows_only():
  mesh, rules = make_mesh((2, 2, 2)), get_rules("default")
  assert batch_sharding(mesh, rules, 3).spec == P(("data", "fsdp"), None, None)
  assert batch_sharding(mesh, get_rules("default", {"batch": "data"}), 2).spec == P("data", None)


def test_shard_batch_keeps_values_and_structure():
  mesh, rules = make_mesh((2, 2, 2)), get_rules("default")
  host = LMBatch(np.arange(8 * 5, dtype=np.int32).reshape(8, 5), np.ones((8, 5), np.float32))
  dev = shard_batch(host, mesh, rules)
  assert isinstance(dev, LMBatch)
  assert dev.tokens_bt.sharding.spec == P(("data", "fsdp"), None)
  assert {s.data.shape for s in dev.tokens_bt.addressable_shards} == {(2, 5)}
  np.testing.assert_array_equal(np.asarray(dev.tokens_bt), host.tokens_bt)
  assert process_batch_rows(8, mesh, rules) == slice(0, 8)  # one process feeds everything


def test_indivisible_batch_names_field_and_axes():
  mesh, rules = make_mesh((2, 2, 2)), get_rules("default")
  with pytest.raises(ValueError, match=r"batch_size=6 is not divisible by the 4 batch shards of mesh axes "
                                       r"\('data', 'fsdp'\) \(data=2, fsdp=2\)"):
    check_batch_divisible(6, mesh, rules)
  with pytest.raises(ValueError, match="batch field tokens_bt rows=6"):
    shard_batch(LMBatch(np.zeros((6, 4), np.int32), np.zeros((6, 4))), mesh, rules)
  check_batch_divisible(6, mesh, get_rules("default", {"batch": "data"}))  # 2 shards: fine


def test_scalar_field_is_rejected():
  with pytest.raises(ValueError, match="batch field temperature is a scalar"):
    shard_batch({"temperature": np.float32(1.0)}, make_mesh((-1, 1, 1)), get_rules("default"))
