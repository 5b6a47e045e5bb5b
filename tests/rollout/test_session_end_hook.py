"""The engines' `on_done` hook (rollout/engine.py OnDone): told of each session as it ends, in the
lockstep and the continuous engine, with the run's ledger so far; it only watches, so the sessions
are the same with and without it. The eval's progress bar rides on it (train/evaluate.py)."""
import jax
import numpy as np
import pytest
from flax import nnx

from rollout_fixtures import TOK, ParityEnv
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
# Many stop ids: actions of every length from 1 token to the budget, so about half the sessions win.
STOPS = [TOK.eos_id] + list(range(32, 96))
TASKS = [0, 1, 2, 3, 4, 5, 98, 99]  # ParityEnv: 1 to 3 turns, a context-cap end, an env_error
G = 2


@pytest.fixture(scope="module")
def sampler():
  policy = Transformer(CFG, rngs=nnx.Rngs(4))
  policy.embed[...] = policy.embed[...] * 8
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=STOPS, log_compiles=False)


class Heard:
  """What an `on_done` hook was told: (ended, total, successes, tokens so far) per call."""

  def __init__(self):
    self.calls = []

  def __call__(self, n_done, n_total, ledger):
    self.calls.append((n_done, n_total, ledger.successes, ledger.generated_total + ledger.prefilled_total))


def _engine(kind, sampler):
  kw = dict(group_size=G, turn_token_budget=8, context_cap=128, num_env_threads=2,
            sampling=SamplingParams(temperature=1.2))
  if kind == "lockstep":
    return RolloutEngine(sampler, TOK, ParityEnv, **kw)
  return ContinuousEngine(sampler, TOK, ParityEnv, rows=3, in_flight=4, chunk=4, **kw)


@pytest.mark.parametrize("kind", ["lockstep", "continuous"])
def test_hook_hears_each_session_end_and_changes_nothing(sampler, kind):
  """One call per session as it ends (counts 1..n of n), the last with the run's successes and tokens;
  the sessions equal a run's without the hook.

  Breaks checked: the hook left out where a session ends before its first action (the lockstep
  engine's failed reset in `_start`, or its context-cap check; the continuous engine's `_end`
  skipped) -- the counts stop short of n; the hook called once per run after the loop with the final
  ledger -- the tokens of the first call equal the last's; the hook told the count before the ledger
  counted the session -- the counts are off by one.
  """
  heard = Heard()
  with_hook = _engine(kind, sampler).run(TASKS, jax.random.key(3), on_done=heard)
  without = _engine(kind, sampler).run(TASKS, jax.random.key(3))
  n = len(TASKS) * G
  assert [c[0] for c in heard.calls] == list(range(1, n + 1))
  assert {c[1] for c in heard.calls} == {n}
  wins = sum(bool(s.success) for s in with_hook.sessions)
  assert 0 < wins < n  # the env's wins are mixed, so a wrong success count shows
  assert heard.calls[-1][2] == wins
  assert heard.calls[-1][3] == with_hook.ledger.generated_total + with_hook.ledger.prefilled_total
  assert heard.calls[0][3] < heard.calls[-1][3]  # told as sessions end, not once at the end
  ends = {s.end_reason for s in with_hook.sessions}
  assert {"env_error", "context_cap", "terminated"} <= ends
  assert _records(with_hook.sessions) == _records(without.sessions)
  np.testing.assert_allclose(_logps(with_hook.sessions), _logps(without.sessions), atol=1e-5)


def _records(sessions) -> list:
  """The sessions' records but the behaviour log-probs: the continuous engine's batch shapes
  follow the env threads' timing, so two of its runs differ in summation order (module doc)."""
  out = [s.to_dict() for s in sessions]
  for d in out:
    for t in d["turns"]:
      t.pop("logp")
  return out


def _logps(sessions) -> np.ndarray:
  return np.concatenate([np.asarray(t.logp, np.float64).reshape(-1) for s in sessions for t in s.turns])
