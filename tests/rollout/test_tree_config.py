"""`rollout.tree` is checked before any compute."""
import pytest

from mtrl_jax.config import base_config, validate


def _cfg(**tree):
  c = base_config()
  c.rl.group_size = 8
  c.rollout.tree.update(enabled=True, **tree)
  return c


def test_tree_config_accepts_a_group_of_whole_trees():
  validate(_cfg(branch_turns=(0, 2), width=2), num_devices=1)  # 2 trees of 4 leaves per task


@pytest.mark.parametrize("tree, match", [
    (dict(branch_turns=(1,), width=3), "multiple"),      # 8 leaves are not whole trees of 3
    (dict(branch_turns=(1, 1), width=2), "distinct"),
    (dict(branch_turns=(1,), width=2, token_budget=-1), "token_budget"),
])
def test_tree_config_names_the_bad_field(tree, match):
  """Catches a validation that lets a group of partial trees through (the
  engine would then overflow its rows) or ignores a negative budget."""
  with pytest.raises(ValueError, match=match) as e:
    validate(_cfg(**tree), num_devices=1)
  assert "config.rollout.tree" in str(e.value)
