"""The eval's progress (train/evaluate.py): `evaluate(progress=...)` hands each play an `on_done`
hook that hears every session end with the success and tokens so far, and the metrics are the same
with it and without; `session_bar` draws that on the job's console bar (metrics.Progress), silent
for its first seconds so the short evals between RL updates print nothing."""
import io
import sys
from pathlib import Path

import jax
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from rollout_fixtures import TOK, ParityEnv  # noqa: E402
from mtrl_jax.models.config import ModelConfig  # noqa: E402
from mtrl_jax.models.transformer import Transformer  # noqa: E402
from mtrl_jax.rollout.continuous import ContinuousEngine  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.rollout.ledger import TokenLedger  # noqa: E402
from mtrl_jax.sampling.sampler import Sampler, SamplingParams  # noqa: E402
from mtrl_jax.train.evaluate import evaluate, session_bar  # noqa: E402

CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
STOPS = [TOK.eos_id] + list(range(32, 96))  # actions of many lengths: some sessions win, some lose
SEEDS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 98, 99]  # ParityEnv: 1-3 turns, a context-cap end, an env_error


@pytest.fixture(scope="module")
def sampler():
  policy = Transformer(CFG, rngs=nnx.Rngs(4))
  policy.embed[...] = policy.embed[...] * 8
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=STOPS, log_compiles=False)


def _engines(kind, sampler):
  def make(sampling):
    kw = dict(turn_token_budget=8, context_cap=128, num_env_threads=2, sampling=sampling)
    if kind == "lockstep":
      return RolloutEngine(sampler, TOK, ParityEnv, **kw)
    return ContinuousEngine(sampler, TOK, ParityEnv, rows=3, in_flight=4, chunk=4, **kw)
  return make(SamplingParams(temperature=1.2)), make(SamplingParams(greedy=True))


@pytest.mark.parametrize("kind", ["lockstep", "continuous"])
def test_progress_counts_match_the_metrics_and_change_nothing(sampler, kind):
  """Each play's hook ends at n of n sessions with eval/success x n (eval/greedy_success x n) wins,
  and the metrics equal an evaluate's without progress, bit for bit.

  Breaks checked: a hook that steers (either engine's run drawing with other keys when `on_done` is
  given; play_share dealing the tasks' keys in reverse order when it is): the metrics differ; the
  greedy play handed the sampled play's hook: the counts are off. (Reversing the tasks themselves
  is no break: each task keeps its own key and the sessions are sorted by group id.)
  """
  heard = {}

  def progress(which, total):
    heard[which] = []
    return lambda n_done, n_total, ledger: heard[which].append((n_done, n_total, ledger.successes))

  rng = jax.random.key(5)
  plain = evaluate(*_engines(kind, sampler), SEEDS, rng)
  watched = evaluate(*_engines(kind, sampler), SEEDS, rng, progress=progress)
  assert watched == plain
  n = len(SEEDS)
  for which, prefix in (("sampled", "eval/"), ("greedy", "eval/greedy_")):
    calls = heard[which]
    assert [c[0] for c in calls] == list(range(1, n + 1))
    assert calls[-1][1] == n
    assert calls[-1][2] == round(plain[f"{prefix}success"] * n)
  assert 0 < plain["eval/success"] < 1  # mixed wins: a wrong count shows


def _ledger(sessions, successes, tokens):
  return TokenLedger(sessions=sessions, successes=successes, generated_total=tokens)


def test_session_bar_draws_success_and_tokens_after_its_quiet_seconds():
  """Past its quiet seconds the bar shows `[label] |###..| k/n`, the success rate and the tokens so
  far; within them it prints nothing (a short eval leaves no line in the log).

  Breaks checked: Progress ignoring `quiet_s` (the quiet bar prints its first and last lines);
  `session_bar` showing the wins as a count, not a rate (`success=3`, not `success=0.75`).
  """
  out = io.StringIO()
  hook = session_bar("rl eval", 4, quiet_s=0.0, stream=out)
  hook(1, 4, _ledger(1, 1, 50))
  hook(4, 4, _ledger(4, 3, 210))
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("[rl eval] |") and " 1/4 " in lines[0] and "success=1 tokens=50" in lines[0]
  assert lines[-1].startswith("[rl eval] |" + "#" * 24 + "| 4/4 ")
  assert "success=0.75" in lines[-1] and "tokens=210" in lines[-1]

  quiet = io.StringIO()
  hook = session_bar("rl eval", 4, quiet_s=60.0, stream=quiet)
  hook(1, 4, _ledger(1, 1, 50))
  hook(4, 4, _ledger(4, 3, 210))
  assert quiet.getvalue() == ""
