"""The learner's trainer/sampler mismatch metric on real sampled sessions (tiny byte model)."""
import numpy as np

from mtrl_jax.rollout.session import make_turn
from tiny_world import learner, sessions_v0


def _restamp(sessions, *, version=None, bump=0.0):
  """Copies with every action token's version (and the first token's logp) changed."""
  out = []
  for s in sessions:
    s = type(s).from_dict(s.to_dict())
    turns = []
    for k, t in enumerate(s.turns):
      logp = t.logp.copy()
      if k == 0 and len(logp):
        logp[0] += bump
      turns.append(make_turn(t.observation, t.obs_ids, t.action, t.action_ids, logp,
                             t.version if version is None else version, t.reward, cut_at_budget=t.cut_at_budget,
                             info=t.info))
    s.turns = turns
    out.append(s)
  return out


def test_update_logs_the_fp32_gap_on_current_version_tokens():
  """fp32 sampler (cached decode) vs learner (full forward): float noise.
  A planted 0.25 gap on one token per session shows as the max; tokens of
  another version are not counted. Break checked: the metric computed
  against pb.behav_logp of all tokens (observation zeros count: mean ~1)."""
  sessions = list(sessions_v0())
  n_act = sum(s.num_action_tokens for s in sessions)
  m = learner().update(sessions, 0)
  assert m["mismatch/tokens"] == n_act
  assert m["mismatch/logp_abs_mean"] < 1e-5 and m["mismatch/logp_abs_max"] < 1e-4
  assert m["mismatch/ratio_out_share"] == 0.0
  half = len(sessions) // 2
  planted = _restamp(sessions[:half], bump=0.25) + _restamp(sessions[half:], version=5, bump=3.0)
  m = learner().update(planted, 0)
  n_cur = sum(s.num_action_tokens for s in sessions[:half])
  assert m["mismatch/tokens"] == n_cur  # the version-5 half (and its 3.0 gap) is not counted
  assert abs(m["mismatch/logp_abs_max"] - 0.25) < 1e-4
  assert abs(m["mismatch/logp_abs_mean"] - 0.25 * half / n_cur) < 1e-4
  assert m["mismatch/ratio_out_share"] == half / n_cur  # exp(0.25) = 1.28: the planted tokens only
