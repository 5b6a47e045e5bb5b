"""Continuations from forked histories with the real sampler: under greedy
decoding every continuation must replay the session's own future exactly,
under the byte layout and under a chat template (which renders every turn
after the whole conversation)."""
import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.envs import registry
from mtrl_jax.envs.base import Env, Reset, Step
from mtrl_jax.lab.continuations import continue_from
from mtrl_jax.lab.credit_accuracy import histories
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer, HFTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64,
                  tie_embeddings=False)
registry.names()


class LenEnv(Env):
  """Reward: the action's character codes summed, mod 5; the observation shows the running total."""

  def __init__(self, horizon: int = 3):
    self.max_turns = horizon

  def _reset(self, seed):
    self.total = self.rng.randrange(5)
    return Reset("len", f"total {self.total}")

  def _step(self, action):
    r = float(sum(ord(ch) for ch in action) % 5)
    self.total += r
    return Step(f"total {self.total:g}", r, False, False, {})

  def expert_action(self):
    return "ab"

  def random_action(self, rng):
    return "a" * rng.randrange(4)


def _replay_check(tok, cfg, horizon=3):
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  # A wide random head: greedy then picks varied tokens (not one special id).
  model.lm_head[...] = 0.5 * jax.random.normal(jax.random.key(2), model.lm_head[...].shape)
  sampler = Sampler.from_model(model, pad_id=tok.pad_id, stop_ids=list(tok.stop_ids), log_compiles=False)
  factory = lambda: LenEnv(horizon)  # noqa: E731
  greedy = SamplingParams(greedy=True)
  engine = RolloutEngine(sampler, tok, factory, group_size=1, turn_token_budget=6, context_cap=256,
                         sampling=greedy, num_env_threads=2)
  sessions = engine.run(list(range(6)), jax.random.key(0)).sessions
  starts = histories(sessions, factory)
  assert len(starts) == sum(s.num_turns for s in sessions)
  done = []
  cont = continue_from(sampler, tok, starts, 3, turn_budget=6, context_cap=256, sampling=greedy,
                       rng=jax.random.key(1), rows_per_call=12, progress=done.append)
  assert done == sorted(done) and done[-1] == len(starts) and len(done) > 1  # progress per chunk
  expected = np.concatenate([np.cumsum([t.reward for t in s.turns][::-1])[::-1] for s in sessions])
  np.testing.assert_allclose(cont.returns_sk, np.repeat(expected[:, None], 3, axis=1), atol=1e-6)
  assert len({float(x) for x in expected}) > 2
  assert cont.tokens_generated > 0 and cont.tokens_prefilled > 0
  return sessions, starts


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer_dir):
  pytest.importorskip("jinja2")
  return HFTokenizer(str(tokenizer_dir))  # no template in the folder: plain ChatML


def test_chat_template_continuations_replay_the_sessions_future(chat_tokenizer):
  """The same replay under a ChatML template: each fork's next prefill must be the
  template's text after the fork's own conversation (prompt, earlier turns, its
  sampled action), as the rollout engine built it. Catches a start that does not
  carry the session's history (the template then renders a first turn, system
  message included, and greedy decoding acts on another context) and a fork whose
  history is not extended with its own action."""
  tok = chat_tokenizer
  cfg = ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                    mlp_dim=64, tie_embeddings=False)
  sessions, starts = _replay_check(tok, cfg, horizon=4)
  later = [s for s in starts if s.turns_done >= 2]
  assert later and all(len(s.history) == s.turns_done for s in later)
  # The chat layout differs from "first turn of a new conversation" after turn 0 (else the test is blind).
  s = later[0]
  assert list(s.obs_ids) != tok.observation_ids(s.observation, None)


def test_chat_template_continuations_need_the_history(chat_tokenizer):
  """Starts without a history under a chat template fail loudly, naming what is missing."""
  from mtrl_jax.lab.continuations import Start
  with pytest.raises(ValueError, match="history"):
    continue_from(None, chat_tokenizer, [Start(LenEnv(), [1, 2], 1)], 2, turn_budget=4, context_cap=64,
                  sampling=SamplingParams(greedy=True), rng=jax.random.key(0))


def test_greedy_continuations_return_the_sessions_return_to_go():
  """A greedy policy is deterministic, so V(h_t) is the session's own return
  from turn t, in every one of the K continuations (the env pays a checksum of the action,
  so returns differ between sessions and turns). Catches a history whose tokens or env
  state are off by a turn (the continuation then acts on another state) and
  continuations whose returns are not summed from turn t."""
  _replay_check(TOK, CFG)
