"""How many programs the sampler compiles: only its own jitted steps, one per shape bucket."""
import jax
import numpy as np
from flax import nnx

from mtrl_jax.compile import counts
from mtrl_jax.sampling.sampler import Sampler, SamplingParams
from sampling_fixtures import PAD, tiny_policy


def test_a_new_length_bucket_compiles_one_program():
  """A prefill chunk of a new length bucket compiles the append step at that shape and nothing
  else: the token batch goes in as numpy. Break checked: the old jnp.asarray(tokens_bt) before
  the jitted append (an eager "stage" program per new shape) -> 2 programs, not 1."""
  gd, params = nnx.split(tiny_policy(3))
  s = Sampler(gd, params, pad_id=PAD, stop_ids=[1], log_compiles=False)
  state = s.init_state(2, 64)
  state = s.append(state, [[5, 6, 7], [8, 9]])  # bucket 16
  out, state = s.generate(state, jax.random.key(0), 4, params=SamplingParams(greedy=True))
  before = counts.compile_counts()
  state = s.append(state, [list(range(10, 30)), [11]])  # 20 tokens: bucket 24, a new shape
  assert counts.delta(before, counts.compile_counts()).programs == 1
  assert np.asarray(s.lengths(state)).tolist() == [3 + 4 + 20, 2 + 4 + 1]
