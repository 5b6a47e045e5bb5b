"""Mesh shapes from config: -1 resolution, errors that name the field, host-major layout."""
import types

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from mtrl_jax.parallel import default_mesh_config, make_mesh, mesh_from_config, setup_from_config
from mtrl_jax.parallel.mesh import arrange_devices, resolve_mesh_shape


@pytest.mark.parametrize("shape,expected", [((-1, 1, 1), (8, 1, 1)), ((1, -1, 2), (1, 4, 2)),
                                            ((2, 2, -1), (2, 2, 2)), ((1, 8, 1), (1, 8, 1))])
def test_minus_one_takes_the_rest(shape, expected):
  mesh = make_mesh(shape)
  assert tuple(mesh.shape.values()) == expected
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert all(t == AxisType.Auto for t in mesh.axis_types)
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


@pytest.mark.parametrize("shape,needle", [
    ((3, 1, 1), "needs 3 devices but 8 are available"),
    ((-1, 3, 1), "multiple of 3 devices"),
    ((-1, -1, 1), "at most one entry may be -1"),
    ((0, 8, 1), "positive"),
    ((-2, 4, 1), "positive"),
    ((8, 1), "has 2 entries"),
    ((8.0, 1, 1), "integers"),
])
def test_bad_shapes_name_the_config_field(shape, needle):
  with pytest.raises(ValueError, match="config.mesh.shape") as e:
    make_mesh(shape)
  assert needle in str(e.value)


def test_explicit_devices_subset():
  mesh = make_mesh((-1, 2, 1), devices=jax.devices()[:4])
  assert tuple(mesh.shape.values()) == (2, 2, 1)


def test_from_config_section():
  cfg = default_mesh_config()
  cfg.shape = (2, -1, 2)
  assert tuple(mesh_from_config(cfg).shape.values()) == (2, 2, 2)
  with pytest.raises(ValueError, match="config.mesh.shape"):
    mesh_from_config({"axis_names": ("data", "fsdp", "tensor")})


def _fake_hosts(platform, n=8, hosts=2):
  # Handed over interleaved, as nothing promises jax.devices() is host-major.
  return [types.SimpleNamespace(platform=platform, process_index=i % hosts, id=i, slice_index=0,
                                device_kind="fake") for i in range(n)]


@pytest.mark.parametrize("platform", ["cpu", "gpu"])  # plain reshape / mesh_utils hybrid mesh
def test_data_axis_spans_hosts(platform):
  grid = arrange_devices(resolve_mesh_shape((2, -1, 2), 8), _fake_hosts(platform))
  hosts = np.vectorize(lambda d: d.process_index)(grid)
  assert (hosts[0] == 0).all() and (hosts[1] == 1).all()


def test_data_axis_smaller_than_hosts_falls_back_to_host_order(caplog):
  grid = arrange_devices((1, 8, 1), _fake_hosts("gpu"))
  hosts = np.vectorize(lambda d: d.process_index)(grid).ravel()
  assert hosts.tolist() == [0] * 4 + [1] * 4  # fsdp crosses hosts once, in order
  assert "not a multiple of the 2 hosts" in caplog.text

def test_setup_from_config_bundles_mesh_rules_and_policy():
  cfg = default_mesh_config()
  cfg.shape, cfg.rules, cfg.rule_overrides, cfg.strict_divisibility = (1, -1, 2), "fsdp", (("vocab", "tensor"),), True
  setup = setup_from_config(cfg)
  assert tuple(setup.mesh.shape.values()) == (1, 4, 2)
  assert dict(setup.rules)["vocab"] == "tensor" and dict(setup.rules)["mlp"] is None
  assert setup.strict is True
