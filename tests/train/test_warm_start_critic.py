"""config.init_from restores a source's critic only when the source pretrained one (train/run.py)."""
import json

from mtrl_jax.train.run import _pretrained_critic


def test_a_source_without_a_separate_critic_has_no_critic_to_restore(tmp_path):
  """A critic-free source (critic.kind 'none', value pretraining off) lists value_pretrain as done (a
  no-op stage); a lab or critic run warm-started from it must not try to restore its critic.

  Break checked: without this check in Run._warm_start, the lab on TextWorld warm-started from a
  critic-free RL run (configs/textworld.py:lab=true with --config.init_from) failed in orbax with
  "Type mismatch at key path ('critic',)".
  """
  for kind, enabled, want in (("none", False, False), ("separate", True, True), ("separate", False, False),
                              ("head", True, False)):
    (tmp_path / "config.json").write_text(json.dumps({"critic": {"kind": kind}, "value_pretrain": {"enabled": enabled}}))
    assert _pretrained_critic(str(tmp_path)) is want, (kind, enabled)
  (tmp_path / "config.json").unlink()
  assert _pretrained_critic(str(tmp_path)) is True  # no record: the restore itself decides
