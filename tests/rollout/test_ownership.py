"""Who plays what on several hosts: shares of the groups, and per-session sampling keys."""
import functools

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.envs import registry
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.ownership import group_key, group_number, host_share, session_keys
from mtrl_jax.sampling.sampler import Sampler

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
registry.names()


@settings(deadline=None, max_examples=200)
@given(tasks=st.integers(1, 64), count=st.integers(1, 16))
def test_shares_partition_the_groups_in_contiguous_blocks(tasks, count):
  """Blocks cover 0..T-1 once, in process order, sizes within one of each other.

  Catches a share that skips or repeats a group (e.g. floor division without
  the remainder), or non-contiguous blocks.
  """
  if tasks < count:
    with pytest.raises(ValueError, match="rl.tasks_per_update"):
      host_share(tasks, 0, count)
    shares = [host_share(tasks, p, count, allow_empty=True) for p in range(count)]
  else:
    shares = [host_share(tasks, p, count) for p in range(count)]
  covered = [j for s in shares for j in s.indices]
  assert covered == list(range(tasks))
  sizes = [s.size for s in shares]
  assert max(sizes) - min(sizes) <= 1
  assert all(shares[p].stop == shares[p + 1].start for p in range(count - 1))


def test_group_numbers_and_keys_do_not_depend_on_the_share():
  base = jax.random.key(3)
  assert group_number(5, 3, 8) == 43
  a = jax.random.key_data(group_key(base, 5, 3))
  b = jax.random.key_data(group_key(base, 5, 4))
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(jax.random.key_data(group_key(base, 5, 3, 0)), a)
  assert not np.array_equal(jax.random.key_data(group_key(base, 5, 3, 1)), a)
  ks = np.asarray(jax.random.key_data(session_keys([group_key(base, 0, j) for j in range(3)], 4)))
  assert ks.shape == (12, 2) and len({tuple(k.tolist()) for k in ks}) == 12


@pytest.fixture(scope="module")
def sampler():
  return Sampler.from_model(Transformer(CFG, rngs=nnx.Rngs(0)), pad_id=TOK.pad_id, stop_ids=[TOK.eos_id],
                            log_compiles=False)


def _engine(sampler):
  return RolloutEngine(sampler, TOK, functools.partial(registry.make, "memory", length=2), group_size=3,
                       turn_token_budget=8, context_cap=192, num_env_threads=4, env_name="memory")


def _tokens(sessions):
  return {s.session_id: (s.group_id, s.seed, [list(t.action_ids) for t in s.turns]) for s in sessions}


def test_a_session_plays_the_same_whichever_batch_it_is_in(sampler):
  """Four groups played in one batch, or split between two "hosts" in any
  order, give the same sessions token for token (same ids, seeds, actions).

  Catches sampling keyed per batch (a key split over the batch's rows, as
  before per-session keys): the split runs then draw different tokens.
  """
  base = jax.random.key(11)
  seeds = [101, 202, 303, 404]
  keys = [group_key(base, 7, j) for j in range(4)]
  ids = [group_number(7, j, 4) for j in range(4)]
  whole = _engine(sampler).run(seeds, group_keys=keys, group_ids=ids).sessions
  host0 = _engine(sampler).run(seeds[:2], group_keys=keys[:2], group_ids=ids[:2]).sessions
  host1 = _engine(sampler).run(seeds[3:1:-1], group_keys=keys[3:1:-1], group_ids=ids[3:1:-1]).sessions
  assert sorted(s.session_id for s in whole) == list(range(28 * 3, 32 * 3))
  assert _tokens(whole) == {**_tokens(host0), **_tokens(host1)}
  # The samples of a group really differ (the keys are per session, not per group).
  first = [tuple(tuple(a) for a in v[2]) for k, v in sorted(_tokens(whole).items())[:3]]
  assert len(set(first)) > 1
