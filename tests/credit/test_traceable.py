"""Every estimator traces with abstract inputs (so it runs under jit), with
the documented output shapes and dtypes.

Under jit, a Python value derived from array data (e.g. a segment count
left to `num_segments=None`) is an error. The mutation runner runs the tests
with jit off, where such a slip goes unnoticed; `jax.eval_shape` traces
abstractly even then, so this test keeps catching it (checked: rloo with
`b = None`, i.e. `num_segments=None`, fails here and passes every other
test with jit off).
"""
import jax
import numpy as np
import pytest

from credit_fixtures import ESTIMATORS, random_sessions, split_per_turn, to_batch
from mtrl_jax.credit import compute_advantages

CRITIC = ("gae", "turn_gae", "bilevel_gae")


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_traces_abstractly_with_documented_shapes(name):
  d = random_sessions(3, n_groups=2, pad_row=True)
  per_turn, _ = split_per_turn(d, 3)
  for arrays in (d, per_turn):
    batch = to_batch(arrays)
    adv, tgt = jax.eval_shape(lambda b: compute_advantages(name, b), batch)
    assert adv.shape == batch.reward_bt.shape and adv.dtype == np.float32
    if name in CRITIC:
      assert tgt.shape == batch.reward_bt.shape and tgt.dtype == np.float32
    else:
      assert tgt is None
