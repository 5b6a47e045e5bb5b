import pytest
from hypothesis import given, settings

from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.session import Session
from rollout_fixtures import session_lists_st


@settings(max_examples=30, deadline=None)
@given(session_lists_st(), session_lists_st())
def test_ledger_adds_up(a, b):
  la, lb = TokenLedger.from_sessions(a), TokenLedger.from_sessions(b)
  la.check(a)
  both = la.merge(lb)
  both.check(a + b)
  assert both.generated_total == sum(s.num_action_tokens for s in a + b)
  assert both.prefilled_total == sum(s.num_obs_tokens for s in a + b)
  assert both.generated_by_turn.sum() == both.generated_total
  assert len(both.generated_by_turn) == max(s.num_turns for s in a + b)
  m = both.to_metrics()
  assert m["ledger/tokens_generated"] == both.generated_total
  assert sum(v for k, v in m.items() if k.startswith("ledger/generated_turn_")) == both.generated_total
  assert sum(v for k, v in m.items() if k.startswith("ledger/prefilled_turn_")) == both.prefilled_total
  assert sum(v for k, v in m.items() if k.startswith("ledger/end_")) == len(a) + len(b)
  assert all(isinstance(v, float) for v in m.values())


def test_check_names_the_disagreeing_counter():
  s = Session(session_id=0, task_id=0, group_id=0, seed=0, env_name="x")
  s.finish("env_error")
  ledger = TokenLedger()
  ledger.record_prefill(0, 5)
  ledger.record_session(s)
  ledger.check()
  with pytest.raises(ValueError, match="prefilled_total"):
    ledger.check([s])
  ledger.prefilled_total += 1
  with pytest.raises(ValueError, match="prefilled_by_turn"):
    ledger.check()
  with pytest.raises(ValueError, match="end_reason"):
    TokenLedger().record_session(Session(session_id=1, task_id=0, group_id=0, seed=0, env_name="x"))


@settings(max_examples=30, deadline=None)
@given(session_lists_st(), session_lists_st())
def test_saved_prefill_and_row_steps_add_up(a, b):
  """Group-shared prefill moves tokens from prefilled to saved (turn 0) and
  `check` still holds against the records; merging adds saved tokens and
  decode row steps; utilisation = generated / row steps. Break checked:
  `merge` keeping only its own `prefill_saved_total`: `check` of the merged
  ledger fails (saved by turn no longer sums to the total)."""
  saved_a = sum(len(s.turns[0].obs_ids) for s in a) // 2
  saved_b = sum(len(s.turns[0].obs_ids) for s in b) // 3
  la = TokenLedger.from_sessions(a, prefill_saved=saved_a, decode_row_steps=1000)
  lb = TokenLedger.from_sessions(b, prefill_saved=saved_b, decode_row_steps=500)
  la.check(a)
  assert la.prefilled_total == sum(s.num_obs_tokens for s in a) - saved_a
  both = la.merge(lb)
  both.check(a + b)
  assert both.prefill_saved_total == saved_a + saved_b and both.decode_row_steps == 1500
  assert both.slot_utilisation == pytest.approx(both.generated_total / 1500)
  m = both.to_metrics()
  assert m["ledger/decode_row_steps"] == 1500.0
  if saved_a + saved_b:
    assert m["ledger/tokens_prefill_saved"] == saved_a + saved_b
  if saved_a:
    bad = TokenLedger.from_sessions(a)
    bad.record_prefill_saved(0, 1)  # a saved token that was also prefilled
    with pytest.raises(ValueError, match="prefilled_total"):
      bad.check(a)
