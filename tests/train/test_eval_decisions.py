"""train/evaluate.py's decision shares: how often the policy takes each turn-0 decision, read with the
env's observation-aware decision (the warm start's 'success at the decision', issue 41 item 3)."""
import types

import pytest

from mtrl_jax.envs import registry
from mtrl_jax.train.evaluate import decision_shares, session_stats


def _session(obs, action, success=False):
  turn = types.SimpleNamespace(observation=obs, action=action)
  return types.SimpleNamespace(turns=[turn], success=success, env_error=None, episode_return=0.0, num_turns=1,
                               num_action_tokens=1, num_obs_tokens=1, rewritten=False)


def test_cued_share_reads_the_sign():
  """Four sessions of `delayed(cue=True)`: three follow their sign (whichever arm it names), one does
  not: decision_cued 0.75 whatever the arms. Break checked: the decision read from the action alone
  (registry's function called without the observation): the shares become left / right."""
  sessions = [_session("sign left: left or right?", "left"), _session("sign right: left or right?", "right"),
              _session("sign right: left or right?", "right"), _session("sign right: left or right?", "left")]
  got = decision_shares(sessions, "eval/", registry.first_decision_fn("delayed"))
  assert got == {"eval/decision_cued": 0.75, "eval/decision_uncued": 0.25}
  assert session_stats(sessions, "eval/greedy_", registry.first_decision_fn("delayed"))[
      "eval/greedy_decision_cued"] == pytest.approx(0.75)


def test_no_decision_no_shares():
  assert decision_shares([_session("x", "y")], "eval/", None) == {}
  assert "eval/decision_cued" not in session_stats([_session("x", "y")], "eval/")
