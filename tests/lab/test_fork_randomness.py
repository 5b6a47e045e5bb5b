"""The lab's forks draw the env randomness the policy has not seen (default), or keep the
session's draws (fork_randomness='crn'): ground truth marginalises over reward noise and
payoff draws instead of conditioning on them."""
import math

import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax import envs
from mtrl_jax.lab.continuations import continue_from, fork_envs
from mtrl_jax.lab.credit_accuracy import histories
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams


def _expert_return(env):
  total = 0.0
  while not env.done:
    total += env.step(env.expert_action()).reward
  return total


@pytest.mark.parametrize("name, kw, value", [
    ("delayed", {"horizon": 6, "noise": 0.3}, 0.95),
    ("bifurcation", {"length": 4, "noise": 0.3}, 0.95)])
def test_fresh_forks_average_to_the_value_crn_forks_repeat_the_session(name, kw, value):
  """From turn 1 after `left`, 2000 fresh forks played by the expert average to the closed-form
  value p_good = 0.95 (4 standard errors), while CRN forks all return the session's own future
  (one number, 0.0 or 1.0 payoff plus its noise). Catches forks that keep the session's draws
  under 'fresh' (every fork equal: the mean is the session's realised return, not 0.95) and, for
  bifurcation, a redraw that leaves the noise signs or the payoff draw fixed at reset."""
  env = envs.make(name, **kw)
  env.reset(11, 0)
  env.step("left")
  own = _expert_return(env.clone())
  crn = [_expert_return(f) for f in fork_envs(env, 50, None)]
  assert set(crn) == {own}
  fresh = np.array([_expert_return(f) for f in fork_envs(env, 2000, 123)])
  se = fresh.std(ddof=1) / math.sqrt(len(fresh))
  assert abs(fresh.mean() - value) < 4 * se
  assert len(set(fresh.round(6))) >= 4
  again = np.array([_expert_return(f) for f in fork_envs(env, 2000, 123)])
  np.testing.assert_array_equal(fresh, again)  # reproducible from the seed


def test_continue_from_fresh_and_crn_with_the_sampler():
  """continue_from on `delayed` sessions (tiny random byte model): from starts after turn 0, whose
  future return depends only on env draws (no format penalty), K = 6 CRN continuations give one
  return per start (the session's own: checked against its rewards), fresh ones spread. A bad
  option names lab.fork_randomness. Catches continue_from ignoring fork_randomness, and the
  lab's histories replaying without the session id (CRN returns then differ from the session's)."""
  tok = ByteTokenizer()
  cfg = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64,
                    tie_embeddings=False)
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  sampler = Sampler.from_model(model, pad_id=tok.pad_id, stop_ids=list(tok.stop_ids), log_compiles=False)
  factory = lambda: envs.make("delayed", horizon=4, noise=0.5)  # noqa: E731
  sampling = SamplingParams(greedy=True)
  engine = RolloutEngine(sampler, tok, factory, group_size=2, turn_token_budget=4, context_cap=256,
                         sampling=sampling, num_env_threads=2)
  sessions = engine.run([0, 1], jax.random.key(0)).sessions
  starts = histories(sessions, factory)
  later = [i for i, s in enumerate(starts) if s.turns_done >= 1]
  kw = dict(turn_budget=4, context_cap=256, sampling=sampling, rng=jax.random.key(1), rows_per_call=24)
  crn = continue_from(sampler, tok, [starts[i] for i in later], 6, fork_randomness="crn", **kw).returns_sk
  fresh = continue_from(sampler, tok, [starts[i] for i in later], 6, **kw).returns_sk
  own = np.concatenate([np.cumsum([t.reward for t in s.turns][::-1])[::-1][1:] for s in sessions])
  np.testing.assert_allclose(crn, np.repeat(own[:, None], 6, axis=1), atol=1e-6)
  assert np.mean([len(set(row.round(6))) for row in fresh]) > 2
  with pytest.raises(ValueError, match="lab.fork_randomness"):
    continue_from(sampler, tok, starts[:1], 2, fork_randomness="same", **kw)
