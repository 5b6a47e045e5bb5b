"""make_credit_batch's defaults and dtypes, AAW sampling's options, and the
registry's own paths (registering, duplicate names, the validated callable).

Found by mutation testing (docs/mutation.md): explicit dtypes that only
matter with x64 on, the default return's segment count (only an abstract
trace sees a data-dependent one), AAW's eps / std / ddof / floor options
and its normalisation for weights summing below 1, and `register` (run at
import, never by a test) survived the earlier tests. Breaks checked by hand
in a scratch copy: make_credit_batch's `jnp.asarray(return_b, jnp.float32)`
without the dtype, `segment_sum(row_sum, ep, num_segments=None)`,
aaw_probabilities' `jnp.maximum(jnp.sum(w), 1e-30)` -> `1.0`, aaw_sample's
default ddof 0 -> 1, and `_REGISTRY[name] = None` in register.
"""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtrl_jax.credit import (aaw_probabilities, aaw_sample, compute_advantages, estimator_names,
                             make_advantage_fn, make_credit_batch, register)
from mtrl_jax.credit import registry
from mtrl_jax.credit.batch import values_or_zeros


def test_defaults_hand_example():
  """Rewards on masked tokens do not count; rows 0 and 2 share episode 5 (return 1 + 2 = 3)."""
  reward = np.array([[1.0, 7.0], [4.0, 0.0], [0.0, 2.0]])
  mask = np.array([[1, 0], [1, 1], [0, 1]])
  batch = make_credit_batch(reward, mask)
  np.testing.assert_array_equal(batch.return_b, [1.0, 4.0, 2.0])
  np.testing.assert_array_equal(batch.turn_idx_bt, np.zeros((3, 2)))
  np.testing.assert_array_equal(batch.group_id_b, [0, 0, 0])
  np.testing.assert_array_equal(batch.episode_id_b, [0, 1, 2])
  np.testing.assert_array_equal(batch.tree_id_b, [0, 1, 2])
  assert batch.value_bt is None
  np.testing.assert_array_equal(values_or_zeros(batch), np.zeros((3, 2)))
  shared = make_credit_batch(reward, mask, episode_id_b=np.array([5, 9, 5]))
  np.testing.assert_array_equal(shared.return_b, [3.0, 4.0, 3.0])
  # Given fields are kept as given.
  full = make_credit_batch(reward, mask, turn_idx_bt=np.array([[0, 1], [2, 3], [4, 5]]),
                           group_id_b=np.array([3, 3, 4]), episode_id_b=np.array([8, 8, 6]),
                           tree_id_b=np.array([1, 2, 2]), return_b=np.array([0.5, 0.5, -1.0]),
                           value_bt=np.full((3, 2), 0.25))
  np.testing.assert_array_equal(full.turn_idx_bt, [[0, 1], [2, 3], [4, 5]])
  np.testing.assert_array_equal(full.group_id_b, [3, 3, 4])
  np.testing.assert_array_equal(full.episode_id_b, [8, 8, 6])
  np.testing.assert_array_equal(full.tree_id_b, [1, 2, 2])
  np.testing.assert_array_equal(full.return_b, [0.5, 0.5, -1.0])
  np.testing.assert_array_equal(values_or_zeros(full), np.full((3, 2), 0.25))
  assert full.shape == (3, 2)


def test_fields_are_float32_and_int32_with_x64_on():
  """The documented dtypes hold even when jax_enable_x64 is on and the inputs are 64-bit."""
  reward = np.array([[1.0, 2.0]])
  jax.config.update("jax_enable_x64", True)
  try:
    for kw in ({}, dict(turn_idx_bt=np.zeros((1, 2), np.int64), group_id_b=np.array([3]),
                        episode_id_b=np.array([4]), tree_id_b=np.array([5]),
                        return_b=np.array([1.5]), value_bt=np.ones((1, 2)))):
      b = make_credit_batch(reward, np.ones((1, 2)), **kw)
      dtypes = [b.reward_bt.dtype, b.loss_mask_bt.dtype, b.return_b.dtype]
      dtypes += [b.value_bt.dtype] if b.value_bt is not None else []
      assert all(d == jnp.float32 for d in dtypes), dtypes
      ints = [b.turn_idx_bt.dtype, b.group_id_b.dtype, b.episode_id_b.dtype, b.tree_id_b.dtype]
      assert all(d == jnp.int32 for d in ints), ints
  finally:
    jax.config.update("jax_enable_x64", False)


def test_default_return_traces_abstractly():
  """The default return's segment count is static (B), so make_credit_batch runs under jit."""
  out = jax.eval_shape(lambda r, m, e: make_credit_batch(r, m, episode_id_b=e),
                       jax.ShapeDtypeStruct((3, 4), jnp.float32), jax.ShapeDtypeStruct((3, 4), jnp.float32),
                       jax.ShapeDtypeStruct((3,), jnp.int32))
  assert out.return_b.shape == (3,) and out.return_b.dtype == jnp.float32


def test_probabilities_with_weights_summing_below_one():
  """|A| = .1, .3 (sum .4 < 1) are still normalised: p = .25, .75."""
  p = aaw_probabilities(jnp.array([0.1, -0.3, 0.0]), jnp.array([True, True, False]))
  np.testing.assert_allclose(p, [0.25, 0.75, 0.0], rtol=1e-6)
  # floor .1 on three valid slots with A = 0, 0, .2: weights .1, .1, .3 -> / .5
  p = aaw_probabilities(jnp.array([0.0, 0.0, 0.2]), jnp.array([True, True, True]), floor=0.1)
  np.testing.assert_allclose(p, [0.2, 0.2, 0.6], rtol=1e-6)


def _two_groups():
  # group 0: returns 0, 2 (two episodes); group 1: returns 0, 0, 3 (three episodes)
  return make_credit_batch(np.zeros((5, 1)), np.ones((5, 1)), group_id_b=np.array([0, 0, 1, 1, 1]),
                           return_b=np.array([0.0, 2.0, 0.0, 0.0, 3.0]))


def _p(abs_adv):
  return np.asarray(abs_adv) / np.sum(abs_adv)


@pytest.mark.parametrize("kw,abs_adv", [
    # population std: group 0 std 1 -> |A| 1, 1; group 1 mean 1, std sqrt 2 -> 1, 1, 2 over sqrt 2
    ({}, [1, 1, 1 / math.sqrt(2), 1 / math.sqrt(2), 2 / math.sqrt(2)]),
    # ddof 1: stds sqrt 2 and sqrt 3
    ({"ddof": 1}, [1 / math.sqrt(2), 1 / math.sqrt(2), 1 / math.sqrt(3), 1 / math.sqrt(3), 2 / math.sqrt(3)]),
    # no std division: |R - mean|
    ({"scale_by_std": False}, [1, 1, 1, 1, 2]),
    # eps .5 in the denominator
    ({"eps": 0.5}, [1 / 1.5, 1 / 1.5, 1 / (math.sqrt(2) + 0.5), 1 / (math.sqrt(2) + 0.5),
                    2 / (math.sqrt(2) + 0.5)]),
])
def test_sample_options_reach_the_advantage(kw, abs_adv):
  _, _, _, probs = aaw_sample(jax.random.key(0), _two_groups(), 2, **kw)
  np.testing.assert_allclose(probs, _p(abs_adv), rtol=1e-5)


def test_sample_floor_and_row_flags():
  """floor 1 on a batch whose only group is flat: every episode gets p = 1/3, all three drawn."""
  batch = make_credit_batch(np.zeros((3, 1)), np.ones((3, 1)), return_b=np.array([1.0, 1.0, 1.0]))
  rows, slots, ok, probs = aaw_sample(jax.random.key(3), batch, 3, floor=1.0)
  np.testing.assert_allclose(probs, [1 / 3] * 3, rtol=1e-6)
  assert sorted(np.asarray(slots).tolist()) == [0, 1, 2] and np.asarray(ok).all()
  assert np.asarray(rows).tolist() == [True, True, True]
  assert np.asarray(slots).dtype == np.int32


def test_register_adds_a_callable_estimator_and_rejects_duplicates():
  def double_return(batch, *, scale: float = 2.0):
    return batch.loss_mask_bt * batch.return_b[:, None] * scale, None

  assert register("test_only_double", double_return) is double_return
  try:
    assert "test_only_double" in estimator_names()
    batch = make_credit_batch(np.array([[0.0, 1.5]]), np.array([[1, 1]]))
    adv, tgt = compute_advantages("test_only_double", batch)
    np.testing.assert_allclose(adv, [[3.0, 3.0]])
    adv, _ = make_advantage_fn("test_only_double", scale=1.0)(batch)
    np.testing.assert_allclose(adv, [[1.5, 1.5]])
    with pytest.raises(ValueError, match=r"^estimator 'test_only_double' is already registered$"):
      register("test_only_double", double_return)
    with pytest.raises(ValueError, match=r"^unknown hyper-parameter\(s\) \['s'\] for estimator "
                                         r"'test_only_double'; valid: \['scale'\]$"):
      make_advantage_fn("test_only_double", s=1.0)
  finally:
    registry._REGISTRY.pop("test_only_double", None)
  assert "test_only_double" not in estimator_names()
  with pytest.raises(ValueError, match=r"^unknown advantage estimator 'x'; valid names: "
                                       + re.escape(", ".join(sorted(estimator_names()))) + "$"):
    compute_advantages("x", batch)
