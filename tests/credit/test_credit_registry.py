"""The registry entry point: names, hyper-parameter checks, masking, jit, vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from credit_fixtures import ESTIMATORS, jitted, random_sessions, seeds, to_batch
from mtrl_jax.credit import (compute_advantages, estimator_names, hparam_defaults,
                             make_advantage_fn)

CRITIC = ("gae", "turn_gae", "bilevel_gae")


def test_registry_holds_exactly_the_documented_names():
  assert set(estimator_names()) == set(ESTIMATORS)


def test_unknown_name_lists_valid_ones():
  batch = to_batch(random_sessions(0))
  with pytest.raises(ValueError) as err:
    compute_advantages("ppo_magic", batch)
  msg = str(err.value)
  assert "ppo_magic" in msg and all(n in msg for n in ESTIMATORS)


def test_unknown_hparam_lists_valid_ones():
  batch = to_batch(random_sessions(0))
  with pytest.raises(ValueError) as err:
    compute_advantages("gae", batch, lamda=0.9)
  msg = str(err.value)
  assert "lamda" in msg and "lambda_policy" in msg and "lambda_critic" in msg
  with pytest.raises(ValueError, match="lambda_policy"):
    compute_advantages("gae", batch, lambda_policy=1.5)


def test_hparam_defaults():
  assert hparam_defaults("gae")["lambda_policy"] == 0.95
  assert hparam_defaults("gae")["lambda_critic"] == 1.0
  assert hparam_defaults("gae")["alpha"] == 0.05
  assert hparam_defaults("ms_grpo")["context"] == "markov"
  assert hparam_defaults("rloo") == {}


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_masked_tokens_get_exactly_zero(seed):
  d = random_sessions(seed, n_groups=3, pad_row=seed % 3 == 0)
  # Garbage rewards and values on masked tokens must not leak anywhere.
  off = d["loss_mask_bt"] == 0
  d["reward_bt"] = np.where(off, 1e6, d["reward_bt"]).astype(np.float32)
  d["value_bt"] = np.where(off, -1e6, d["value_bt"]).astype(np.float32)
  d["turn_reward_bt"] = np.where(off, 1e6, d["turn_reward_bt"]).astype(np.float32)
  d["progress_bt"] = np.where(off, -1e6, d["progress_bt"]).astype(np.float32)
  d["state_id_bt"] = np.where(off, 12345, d["state_id_bt"]).astype(np.int32)
  batch = to_batch(d)
  for name in ESTIMATORS:
    adv, tgt = jitted(name)(batch)
    assert np.all(np.asarray(adv)[off] == 0.0), name
    assert np.all(np.isfinite(np.asarray(adv))), name
    if name in CRITIC:
      assert np.all(np.asarray(tgt)[off] == 0.0), name
      assert np.all(np.abs(np.asarray(tgt)) < 1e3), name
    else:
      assert tgt is None


def _stack(batches):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *batches)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_jit_and_vmap_over_seeds(name):
  batches = [to_batch(random_sessions(s)) for s in range(3)]
  fn = make_advantage_fn(name)
  adv_v, tgt_v = jax.jit(jax.vmap(fn))(_stack(batches))
  assert adv_v.shape == (3,) + batches[0].reward_bt.shape
  for s, b in enumerate(batches):
    adv, tgt = jax.jit(fn)(b)
    np.testing.assert_allclose(adv_v[s], adv, rtol=1e-5, atol=1e-6)
    if tgt is not None:
      np.testing.assert_allclose(tgt_v[s], tgt, rtol=1e-5, atol=1e-6)
    else:
      assert tgt_v is None


def test_docs_page_lists_every_estimator_and_hparam():
  import pathlib
  doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "credit.md").read_text()
  for name in estimator_names():
    assert f"### `{name}`" in doc, name
    for hp in hparam_defaults(name):
      assert f"`{hp}" in doc, (name, hp)
