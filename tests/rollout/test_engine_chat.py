"""Token-in/token-out through the engine: the real SmolLM2 tokenizer, template and
vocabulary (2-block slice), the real jitted sampler.

What the KV cache was fed (prefills) and produced (samples) is recorded per
row and compared with the session records and with the learner's packed
batch: the ids trained on are exactly the ids prefilled and sampled.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from mtrl_jax.envs import registry  # noqa: E402
from mtrl_jax.models import hf  # noqa: E402
from mtrl_jax.models.tokenizer import HFTokenizer  # noqa: E402
from mtrl_jax.models.transformer import token_logprobs  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.rollout.packing import pack_sessions  # noqa: E402
from mtrl_jax.sampling.sampler import Sampler, SamplingParams  # noqa: E402

registry.names()


class RecordingSampler:
  """Delegates to a Sampler and keeps, per row, every id that entered the cache."""

  def __init__(self, inner):
    self.inner = inner
    self.fed: dict[int, list[int]] = {}

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def append(self, state, new_tokens):
    for r, ids in enumerate(new_tokens):
      self.fed.setdefault(r, []).extend(int(i) for i in ids)
    return self.inner.append(state, new_tokens)

  def generate(self, state, rng, budget, *, active, params):
    out, state = self.inner.generate(state, rng, budget, active=active, params=params)
    for r in np.nonzero(np.asarray(active))[0]:
      self.fed.setdefault(int(r), []).extend(int(i) for i in np.asarray(out.tokens[r]).reshape(-1))
    return out, state


@pytest.fixture(scope="module")
def smol(smollm2_2layer):
  tok = HFTokenizer(smollm2_2layer)
  policy = hf.load_policy(smollm2_2layer)
  return tok, policy


def test_cache_session_and_batch_hold_the_same_ids(smol):
  """Break checked: closing a cut action inside the action ids (trained on
  ids that were never sampled) fails the cache == flat_tokens check; the old
  HFTokenizer layout (no history) fails the template-text check."""
  tok, policy = smol
  sampler = RecordingSampler(Sampler.from_model(policy, pad_id=tok.pad_id, stop_ids=tok.stop_ids,
                                                log_compiles=False, version=2))
  factory = functools.partial(registry.make, "memory", length=1, style="natural")
  engine = RolloutEngine(sampler, tok, factory, group_size=2, turn_token_budget=6, context_cap=512,
                         sampling=SamplingParams(temperature=1.0), num_env_threads=2, env_name="memory")
  sessions = engine.run([11, 12], jax.random.key(0)).sessions
  cut = 0
  for r, s in enumerate(sessions):
    assert s.done and not s.env_error
    # Token-in/token-out: the session is exactly what the cache held.
    assert s.flat_tokens().tolist() == sampler.fed[r]
    # ... and its text is the chat template's rendering of the conversation.
    text = tok.decode(s.flat_tokens(), skip_special_tokens=False)
    assert tok.chat.render(s.prompt, s.turns, None).startswith(text)
    for k, t in enumerate(s.turns):
      assert t.version.tolist() == [2] * len(t.action_ids)
      if k and s.turns[k - 1].cut_at_budget:
        cut += 1
        assert t.obs_ids[0] == tok.eos_id  # the cut action is closed in the next prefill
  assert cut > 0, "no cut action: the check of closing ids did not run"
  batch = pack_sessions(sessions, pad_id=tok.pad_id)
  for b, s in enumerate(sessions):
    n = len(s.flat_tokens())
    assert batch.tokens_bt[b, :n].tolist() == s.flat_tokens().tolist()
  # The behaviour log-probs are the policy's log-probs of those very ids.
  logits, _ = policy(jnp.asarray(batch.tokens_bt))
  logp = np.asarray(token_logprobs(logits, jnp.asarray(batch.targets_bt)))
  m = batch.loss_mask_bt == 1
  assert m.sum() == sum(s.num_action_tokens for s in sessions)
  np.testing.assert_allclose(logp[m], batch.behav_logp_bt[m], atol=2e-4)
