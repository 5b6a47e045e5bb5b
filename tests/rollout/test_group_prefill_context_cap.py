"""Group prefill x context cap, in both engines (issue 34).

test_continuous.py runs group prefill at a cap no session reaches (128, the
longest session 93 tokens) and the context cap without group prefill; here
both switches are on at once, with a cap that ends sessions mid-run, and each
engine's sessions must equal the lockstep engine's without group prefill at
the same cap (the reference: group prefill shares a prefill, it changes no
session).
"""
import jax
import numpy as np
import pytest
from flax import nnx

from rollout_fixtures import TOK, CountEnv
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

# The shapes of test_continuous.py (one layer, tied embeddings x 8 so a wrong
# cache row changes sampled tokens), and its cap that ends sessions mid-run.
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
STOPS = [TOK.eos_id] + list(range(32, 96))
BUDGET, CAP, G = 16, 110, 2
TASKS = [11, 12, 13, 14]


class CappedEnv(CountEnv):
  """A 40-character shared prompt (what group prefill saves) and 6 turns (so the cap is hit)."""

  def __init__(self):
    super().__init__(horizon=6)

  def _reset(self, seed):
    r = super()._reset(seed)
    return r._replace(prompt="count up from the number shown, one per turn")


@pytest.fixture(scope="module")
def sampler():
  policy = Transformer(CFG, rngs=nnx.Rngs(4))
  policy.embed[...] = policy.embed[...] * 8
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=STOPS, log_compiles=False, version=5)


def _kw(**kw):
  return {"group_size": G, "turn_token_budget": BUDGET, "context_cap": CAP, "num_env_threads": 4,
          "env_name": "count", "sampling": SamplingParams(temperature=1.2), **kw}


def _same_sessions(a, b, atol=1e-5):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    dx, dy = x.to_dict(), y.to_dict()
    tx, ty = dx.pop("turns"), dy.pop("turns")
    assert dx == dy
    assert len(tx) == len(ty)
    for p, q in zip(tx, ty):
      lp, lq = p.pop("logp"), q.pop("logp")
      assert p == q  # ids, text, versions, rewards, flags
      np.testing.assert_allclose(lp, lq, atol=atol)


@pytest.fixture(scope="module")
def reference(sampler):
  return RolloutEngine(sampler, TOK, CappedEnv, **_kw()).run(TASKS, jax.random.key(3))


@pytest.mark.parametrize("engine", ["lockstep", "continuous_row_copies", "continuous_parked"])
def test_group_prefill_under_a_context_cap_changes_no_session(sampler, reference, engine):
  """Cap 110 with group prefill on: some sessions end on the cap, and every
  session (tokens, texts, end reasons, versions, rewards; log-probs to 1e-5)
  equals the lockstep engine's without group prefill at the same cap, in the
  lockstep engine and in the continuous one with one group live at a time
  (followers copy the leader's row) and with three (followers parked); the
  saved prefill is (G - 1) x each group's first observation.

  Bug caught (issue 34, checked on a scratch edit): ContinuousEngine's
  `_fork_followers` not copying the leader's length to a follower
  (`lv.length = lead.length` left out): the follower's cap check counts from
  0, it decodes past the cap and `append_rows` raises "would exceed the cache
  capacity 110" (both continuous cases fail).
  """
  assert "context_cap" in {s.end_reason for s in reference.sessions}
  if engine == "lockstep":
    res = RolloutEngine(sampler, TOK, CappedEnv, group_prefill=True, **_kw()).run(TASKS, jax.random.key(3))
  else:
    in_flight = 2 if engine == "continuous_row_copies" else 6
    eng = ContinuousEngine(sampler, TOK, CappedEnv, rows=2, in_flight=in_flight, chunk=4, group_prefill=True,
                           **_kw())
    res = eng.run(TASKS, jax.random.key(3))
  _same_sessions(reference.sessions, res.sessions)
  res.ledger.check(res.sessions)
  first = {s.session_id: len(s.turns[0].obs_ids) for s in reference.sessions}
  expect_saved = sum(first[s.session_id] for i, s in enumerate(reference.sessions) if i % G)
  assert expect_saved >= 40 * len(TASKS)
  assert res.ledger.prefill_saved_total == expect_saved
  assert res.ledger.prefilled_total == reference.ledger.prefilled_total - expect_saved
