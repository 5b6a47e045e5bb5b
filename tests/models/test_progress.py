"""The progress head's read-out and loss (models/progress.py, train/progress.py), by hand."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.progress import ProgressModel, turn_shares
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.train.progress import progress_loss, turn_ends


def test_turn_ends_and_shares_hand_example():
  """Two turns in a row: obs, a, a | obs, a. Target-aligned mask 0 1 1 0 1 0
  (the last position predicts padding). Turn ends at positions 2 and 4; the
  share of a turn is the output one position later (3 and 5), whose input is
  the turn's last action token. Break checked: reading the share at the end
  position itself (p instead of p + 1) gives 2 and 4 and fails."""
  mask = np.array([[0, 1, 1, 0, 1, 0]], np.float32)
  turn = np.array([[0, 0, 0, 1, 1, 1]], np.int32)
  ends = turn_ends(mask, turn)
  np.testing.assert_array_equal(ends, [[0, 0, 1, 0, 1, 0]])
  out = jnp.arange(6, dtype=jnp.float32)[None, :]
  np.testing.assert_array_equal(np.asarray(turn_shares(out, jnp.asarray(ends))), [[0, 0, 3, 0, 5, 0]])
  # Adjacent turns with no observation between them still end separately.
  np.testing.assert_array_equal(turn_ends(np.array([[1, 1, 1]]), np.array([[0, 1, 1]])), [[1, 0, 1]])


def test_progress_loss_counts_each_episode_once_across_rows():
  """Episode 0 spans rows 0 and 1 (per-turn layout), episode 1 is row 2,
  row 3 is padding. Shares 1 + 2 for episode 0 (return 4): gap -1; episode 1
  share 5 (return 3): gap 2 -> loss (1 + 4) / 2 = 2.5. Break checked: the
  return read from every row of an episode (counting episode 0 twice) gives
  (1 + 1 + 4) / 3 and fails; so does counting the padding row."""
  out = jnp.array([[0, 1, 0], [0, 2, 0], [0, 5, 0], [0, 9, 0]], jnp.float32)  # share read at p + 1
  ends = jnp.array([[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]], jnp.float32)
  loss, share = progress_loss(out, ends, jnp.array([0, 0, 1, 2]), jnp.array([4.0, 4.0, 3.0, 0.0]),
                              jnp.array([1.0, 1.0, 1.0, 0.0]))
  assert float(loss) == pytest.approx(2.5)
  np.testing.assert_array_equal(np.asarray(share)[:, 0], [1, 2, 5, 9])


def test_progress_model_starts_from_the_policy_trunk_with_a_zero_head():
  """Its trunk equals the policy's (a copy, not shared) and every output is 0 at first."""
  cfg = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  policy = Transformer(cfg, rngs=nnx.Rngs(0))
  model = ProgressModel.from_policy(policy, rngs=nnx.Rngs(5))
  pol = dict(nnx.to_flat_state(nnx.state(policy, nnx.Param)))
  for path, var in nnx.to_flat_state(nnx.state(model.trunk, nnx.Param)):
    np.testing.assert_array_equal(np.asarray(var.get_value()), np.asarray(pol[path].get_value()))
  tokens = jnp.array([[5, 6, 7, 8]], jnp.int32)
  assert np.all(np.asarray(model(tokens)) == 0.0)
