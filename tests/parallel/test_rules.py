"""Logical-axis rules: presets, overrides, validation, activation view."""
import pytest
from jax.sharding import PartitionSpec as P

from mtrl_jax.parallel import (LOGICAL_AXES, PRESETS, activation_rules, get_rules, logical_to_spec,
                               make_mesh, rules_from_config, validate_rules)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_map_every_logical_axis(preset):
  assert sorted(dict(get_rules(preset))) == sorted(LOGICAL_AXES)


def test_default_and_fsdp_presets():
  d, f = dict(get_rules("default")), dict(get_rules("fsdp"))
  assert d["batch"] == f["batch"] == ("data", "fsdp")
  assert d["embed"] == f["embed"] == "fsdp"
  assert [d[n] for n in ("mlp", "heads", "kv_heads", "vocab")] == ["tensor"] * 4
  assert [f[n] for n in ("mlp", "heads", "kv_heads", "vocab", "length", "head_dim")] == [None] * 6


def test_overrides_replace_entries_and_normalise():
  rules = dict(get_rules("default", {"vocab": None, "mlp": ["tensor"], "batch": ("data",)}))
  assert rules["vocab"] is None and rules["mlp"] == "tensor" and rules["batch"] == "data"
  assert dict(get_rules("fsdp", (("heads", "tensor"),)))["heads"] == "tensor"


def test_unknown_names_are_errors():
  with pytest.raises(ValueError, match="config.mesh.rules='tp'"):
    get_rules("tp")
  with pytest.raises(ValueError, match="'vocabb'"):
    get_rules("default", {"vocabb": None})
  with pytest.raises(ValueError, match=r"no rule for logical axis/axes \['vocab'\]"):
    validate_rules(tuple(p for p in get_rules("default") if p[0] != "vocab"))
  with pytest.raises(ValueError, match="mapped twice"):
    validate_rules(get_rules("default") + (("vocab", None),))


def test_mesh_axes_must_exist():
  mesh = make_mesh((-1, 1, 1))
  rules = get_rules("default", {"vocab": "model"})
  with pytest.raises(ValueError, match="'vocab' maps to mesh axis 'model'"):
    validate_rules(rules, mesh)


def test_rules_from_config_section():
  rules = rules_from_config({"rules": "fsdp", "rule_overrides": (("vocab", "tensor"),)})
  assert dict(rules)["vocab"] == "tensor" and dict(rules)["mlp"] is None


def test_activation_rules_give_batch_axes_priority():
  act = dict(activation_rules(get_rules("default")))
  assert act["batch"] == ("data", "fsdp") and act["embed"] is None and act["heads"] == "tensor"
  # Otherwise [batch, length, embed] would use `fsdp` twice, which JAX rejects.
  assert logical_to_spec(("batch", "length", "embed"), tuple(act.items())) == P(("data", "fsdp"), None, None)


def test_spec_of_unmapped_name_is_an_error():
  with pytest.raises(ValueError, match="'experts' has no rule"):
    logical_to_spec(("experts", "embed"), get_rules("default"))
