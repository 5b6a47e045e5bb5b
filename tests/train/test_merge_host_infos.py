"""Merging the per-host metrics of one update (multi-host runs)."""
import pytest

from mtrl_jax.rollout.session import Session, make_turn
from mtrl_jax.train.source import merge_host_infos


def _session(sid, success, ret):
  s = Session(session_id=sid, task_id=0, group_id=sid // 2, seed=0, env_name="x")
  s.turns.append(make_turn("o", [1], "a", [2], [-0.5], 0, ret))
  s.finish("terminated", success=success)
  return s


def test_counts_add_up_outcomes_come_from_all_sessions_and_maxima_stay_maxima():
  """Catches averaging counts over hosts (tokens would halve), taking one host's
  success rate, or averaging a staleness maximum."""
  host0 = {"ledger/tokens_generated": 100.0, "ledger/turns": 10.0, "ledger/sessions": 2.0,
           "ledger/turns_per_session": 5.0, "ledger/generated_per_turn": 10.0, "rollout/success": 1.0,
           "staleness/max": 1.0, "staleness/mean": 0.5, "staleness/hist_0": 2.0, "time/rollout_s": 2.0,
           "queue/started_total": 4.0}
  host1 = {"ledger/tokens_generated": 300.0, "ledger/turns": 20.0, "ledger/sessions": 2.0,
           "ledger/turns_per_session": 10.0, "ledger/generated_per_turn": 15.0, "rollout/success": 0.0,
           "staleness/max": 3.0, "staleness/mean": 1.5, "staleness/hist_0": 1.0, "time/rollout_s": 4.0,
           "queue/started_total": 6.0}
  sessions = [_session(0, True, 1.0), _session(1, True, 1.0), _session(2, False, 0.0), _session(3, True, 0.5)]
  out = merge_host_infos([host0, host1], sessions)
  assert out["ledger/tokens_generated"] == 400.0 and out["ledger/sessions"] == 4.0
  assert out["ledger/turns_per_session"] == pytest.approx(30.0 / 4.0)
  assert out["ledger/generated_per_turn"] == pytest.approx(400.0 / 30.0)
  assert out["rollout/success"] == pytest.approx(0.75) and out["ledger/success_rate"] == pytest.approx(0.75)
  assert out["rollout/return"] == pytest.approx(2.5 / 4)
  assert out["staleness/max"] == 3.0 and out["staleness/mean"] == pytest.approx(1.0)
  assert out["staleness/hist_0"] == 3.0 and out["queue/started_total"] == 10.0
  assert out["time/rollout_s"] == pytest.approx(3.0) and out["rollout/hosts"] == 2
