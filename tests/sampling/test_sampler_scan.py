"""The sampler drives a scanned policy (ModelConfig.scan_layers): its stacked
KV cache [L, B, KV, S, hd] grows along the slot ladder like the tuple of an
unrolled policy, and greedy decoding is identical in both layouts."""
import jax
import numpy as np
from sampling_fixtures import PAD, next_logits, random_rows, tiny_policy

from mtrl_jax.models.transformer import with_layout
from mtrl_jax.sampling import buckets
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

GREEDY = SamplingParams(greedy=True)


def test_greedy_sessions_are_identical_in_both_layouts():
  """Multi-turn, ragged rows, one inactive row, caches grown past MIN_SLOTS.
  Catches a cache growth that unstacks the layers (grow_cache mapping over
  the stacked array) or pads the wrong axis, and any layer mix-up in the
  cached scan."""
  unrolled = tiny_policy(0)
  scanned = with_layout(unrolled, True)
  samplers = [Sampler.from_model(m, pad_id=PAD, stop_ids=[2], log_compiles=False) for m in (unrolled, scanned)]
  capacity = 160
  states = [s.init_state(3, capacity) for s in samplers]
  assert states[1].cache.k.shape[0] == unrolled.cfg.n_layers  # stacked, not a tuple
  rng = np.random.default_rng(3)
  seqs = [[], [], []]
  turns = [([20, 5, 33], [1, 1, 1]), ([30, 0, 12], [1, 0, 1]), ([25, 9, 31], [1, 1, 1])]
  for t, (obs_lengths, active) in enumerate(turns):
    new = random_rows(rng, obs_lengths)
    states = [s.append(st, new) for s, st in zip(samplers, states)]
    seqs = [a + b for a, b in zip(seqs, new)]
    outs = []
    for i, s in enumerate(samplers):
      out, states[i] = s.generate(states[i], jax.random.key(t), 12, active=np.array(active, bool), params=GREEDY)
      outs.append(out)
    for b in range(3):
      assert outs[0].tokens[b].tolist() == outs[1].tokens[b].tolist(), f"turn {t} row {b}"
      np.testing.assert_allclose(outs[1].logps[b], outs[0].logps[b], atol=1e-5)
      seqs[b] = seqs[b] + outs[0].tokens[b].tolist()
    np.testing.assert_array_equal(samplers[1].lengths(states[1]), samplers[0].lengths(states[0]))
  assert max(len(s) for s in seqs) > buckets.MIN_SLOTS  # the caches did grow
  assert states[1].cache.capacity == states[0].cache.capacity > buckets.MIN_SLOTS
  assert states[1].cache.k.shape[0] == unrolled.cfg.n_layers
  # The scanned cache still predicts what a cache-free forward does.
  np.testing.assert_allclose(np.asarray(states[1].last_logits_bv), next_logits(unrolled, seqs), atol=1e-5)
