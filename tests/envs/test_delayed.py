"""The `delayed` probe: closed-form values against Monte-Carlo returns, per-session noise
(CRN only when asked), long actions, the lab's fresh draws (redraw)."""
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtrl_jax import envs


def _play(env, seed, session, policy, rng):
  """(rewards, actions) of one session; policy(env, rng) -> action."""
  env.reset(seed, session)
  rewards, actions = [], []
  while not env.done:
    a = policy(env, rng)
    rewards.append(env.step(a).reward)
    actions.append(a)
  return rewards, actions


def _mixed(p_left):
  def policy(env, rng):
    if env.turn == 0:
      return "left" if rng.random() < p_left else "right"
    return env.expert_action()
  return policy


@pytest.mark.parametrize("arm", ["left", "right"])
def test_decision_value_equals_monte_carlo_returns(arm):
  """decision_value(t, arm) is the mean return from turn t on of sessions that chose `arm`
  (n = 3000 independent sessions over 30 tasks; tolerance 4 standard errors).
  Catches: the payoff drawn against the wrong arm's probability (0.95 vs 0.3: off by ~40 se),
  the cost charged at later turns, or noise that is not zero-mean (a bias of noise*(H-1))."""
  h, n = 6, 3000
  env = envs.make("delayed", horizon=h, tokens_per_action=3, noise=0.3)
  rng = random.Random(0)
  rets = np.array([_play(env, i % 30, i, _mixed(1.0 if arm == "left" else 0.0), rng)[0] for i in range(n)])
  for t in (0, 1, h - 1):
    mc = rets[:, t:].sum(1)
    se = mc.std(ddof=1) / math.sqrt(n)
    assert abs(mc.mean() - env.decision_value(t, arm)) < 4 * se, (t, mc.mean(), env.decision_value(t, arm))
  assert env.decision_value(0, "left") == pytest.approx(0.95 - 0.1)
  assert env.decision_value(1, "left") == pytest.approx(0.95)
  assert env.decision_value(0, "right") == pytest.approx(0.3)


def test_no_closed_form_with_a_format_penalty():
  """Catches decision_value claiming a closed form when later replies change the return."""
  assert envs.make("delayed", invalid_penalty=0.1).decision_value(0, "left") is None


def test_noise_is_per_session_unless_crn():
  """Sessions of one task (same seed, session ids 0..7) share the strings but not the noise or
  the payoff; the same session id replays the same draws; crn=True gives all eight the same.
  Catches: the noise drawn from the task seed (self.rng: all eight equal, as in bifurcation),
  crn ignored, or the session id ignored (not reproducible)."""
  def runs(crn):
    env = envs.make("delayed", horizon=16, tokens_per_action=2, crn=crn)
    out = [_play(env, 5, s, _mixed(1.0), random.Random(0)) for s in range(8)]
    return [tuple(r) for r, _ in out], [tuple(a) for _, a in out]
  rewards, actions = runs(False)
  assert len(set(actions)) == 1            # the task: same strings for every session
  assert len(set(rewards)) == 8            # the session: 15 independent signs each
  assert rewards == runs(False)[0]         # reproducible per (seed, session)
  crn_rewards, _ = runs(True)
  assert len(set(crn_rewards)) == 1
  # Without a session id and without crn: fresh draws every reset (never the task's).
  env = envs.make("delayed", horizon=16)
  assert len({tuple(_play(env, 5, None, _mixed(1.0), random.Random(0))[0]) for _ in range(4)}) == 4


def test_the_payoff_is_the_sessions_draw_unless_crn():
  """Noise 0, so the last reward is the payoff alone: 16 sessions of one task playing the free arm
  (p_bad 0.5) are paid or not each on its own draw (both outcomes occur), the same session id is
  paid the same way again, and with crn=True all 16 are paid alike.
  Break checked: the payoff drawn from the task's rng (`self.rng`, as the strings are): all 16
  sessions paid alike (the noise test above still passes then: its 15 noise signs differ)."""
  def payoffs(crn):
    env = envs.make("delayed", horizon=3, noise=0.0, p_bad=0.5, crn=crn)
    return [_play(env, 5, s, _mixed(0.0), random.Random(0))[0][-1] for s in range(16)]
  paid = payoffs(False)
  assert set(paid) == {0.0, 1.0} and paid == payoffs(False)
  assert len(set(payoffs(True))) == 1


def test_long_sessions_reach_ten_thousand_action_tokens():
  """horizon 128 at 100 letters an action: 1 + 127 * 100 characters copied (one byte-model
  token each, stop tokens aside), every copy valid for the expert and invalid when one letter
  is off. Catches tokens_per_action not setting the strings' length, or the copy check."""
  env = envs.make("delayed", horizon=128, tokens_per_action=100)
  env.reset(0, 0)
  chars, invalid = 0, []
  while not env.done:
    a = env.expert_action()
    if env.turn == 7:
      a = a[:-1] + ("a" if a[-1] != "a" else "b")
    chars += len(a)
    invalid.append(env.step(a).info["invalid_action"])
  assert chars == 4 + 127 * 100
  assert [i for i, bad in enumerate(invalid) if bad] == [7]


def test_redraw_gives_forks_fresh_noise_and_clones_keep_it():
  """A clone continues with the original's draws (CRN forks); redraw(seed) gives it new ones.
  Catches redraw leaving the session's stream in place (forks would all share the noise)."""
  env = envs.make("delayed", horizon=24)
  env.reset(1, 3)
  env.step("left")
  def future(e):
    e = e.clone() if e is env else e
    return tuple(e.step(e.expert_action()).reward for _ in range(22))
  same = [future(env) for _ in range(3)]
  assert len(set(same)) == 1
  forks = []
  for k in range(3):
    f = env.clone()
    f.redraw(100 + k)
    forks.append(future(f))
  assert len(set(forks)) == 3


@settings(max_examples=30, deadline=None)
@given(h=st.integers(2, 12), tpa=st.integers(1, 8), seed=st.integers(0, 10**6), session=st.integers(0, 10**6),
       noise=st.sampled_from([0.0, 0.1, 0.5]), arm=st.sampled_from(["left", "right"]))
def test_every_reward_is_cost_noise_and_payoff(h, tpa, seed, session, noise, arm):
  """Turn 0 pays -cost (left) or 0, each copy turn exactly +-noise, the last also 0 or 1, and the
  session lasts `horizon` turns. Catches a copy turn paying anything but the noise (e.g. a
  payoff leaking into a middle turn) or an off-by-one horizon."""
  env = envs.make("delayed", horizon=h, tokens_per_action=tpa, noise=noise)
  rewards, actions = _play(env, seed, session, _mixed(1.0 if arm == "left" else 0.0), random.Random(seed))
  assert len(rewards) == h and all(len(a) == tpa for a in actions[1:])
  assert rewards[0] == pytest.approx(-0.1 if arm == "left" else 0.0)
  for r in rewards[1:-1]:
    assert abs(abs(r) - noise) < 1e-12
  assert min(abs(rewards[-1] - noise * s - p) for s in (-1, 1) for p in (0, 1)) < 1e-12


def test_state_keys_and_natural_style():
  """Keys are (turn, arm) of the state the action was taken in; the natural style reads a
  sentence for the arm and the string. Catches a key taken after the step moved the env."""
  env = envs.make("delayed", horizon=3, tokens_per_action=4, style="natural")
  first = env.reset(2, 0)
  assert "left or right" in first.observation
  s0 = env.step("I take the left path.")
  assert s0.info["state_key"] == "t0" and s0.reward == pytest.approx(-0.1)
  s1 = env.step(f"'{env.strings[0]}'")
  assert s1.info == {**s1.info, "state_key": "t1:left", "invalid_action": False}


@pytest.mark.parametrize("kw, field", [({"horizon": 1}, "horizon"), ({"tokens_per_action": 0}, "tokens_per_action"),
                                       ({"p_good": 1.5}, "p_good"), ({"noise": -1}, "noise")])
def test_bad_config_names_its_field(kw, field):
  with pytest.raises(ValueError, match=field):
    envs.make("delayed", **kw)


@pytest.mark.parametrize("h, tpa", [(2, 1), (8, 10), (32, 100), (128, 100)])
def test_study_config_fits_the_expert_session(h, tpa):
  """configs/study.py:probe=delayed passes horizon and tpa to the env, per-session noise unless
  crn=true, and sizes the turn budget and context cap so the expert's whole session fits (byte
  tokenizer: every observation's prefill plus every action and its stop token). Catches a cap or
  a budget that cut the long sessions short (the horizon would silently shrink)."""
  from configs.study import get_config
  from mtrl_jax.models.tokenizer import ByteTokenizer, continuation_ids
  c = get_config(f"probe=delayed,horizon={h},tpa={tpa}")
  assert (c.env.kwargs.horizon, c.env.kwargs.tokens_per_action, c.env.kwargs.crn) == (h, tpa, False)
  assert get_config(f"probe=delayed,horizon={h},tpa={tpa},crn=true").env.kwargs.crn is True
  tok = ByteTokenizer()
  env = envs.make("delayed", **dict(c.env.kwargs))
  first = env.reset(0, 0)
  obs, used, hist = first.observation, 0, []
  while not env.done:
    used += len(continuation_ids(tok, first.prompt, hist, obs))
    a = env.expert_action()
    assert len(tok.encode(a)) + 1 <= c.rollout.turn_budget
    used += len(tok.encode(a)) + 1
    hist.append(a)
    obs = env.step(a).observation
  assert used <= c.rollout.context_cap
  with pytest.raises(ValueError, match="tpa"):
    get_config("probe=revisit,tpa=3")
  with pytest.raises(ValueError, match="crn"):
    get_config("probe=bifurcation,crn=true")


def test_demos_are_reproducible():
  """A demo is session 0 of its task: recording it twice gives the same rewards (per-session noise
  seeded, not drawn from the OS). Catches demos resetting without a session id."""
  from mtrl_jax.data.demos import record_episode
  env = envs.make("delayed", horizon=12, noise=0.5)
  a, b = (record_episode(env, 4, 1.0, "delayed", {"horizon": 12, "noise": 0.5}) for _ in range(2))
  ra, rb = ([t["reward"] for t in x["turns"]] for x in (a, b))
  assert ra == rb and len(set(ra[1:-1])) == 2


def _cued(p_cued):
  """Turn 0: the arm the sign shows w.p. p_cued, else the other; then the expert's copies."""
  def policy(env, rng):
    if env.turn == 0:
      other = "right" if env.good == "left" else "left"
      return env.good if rng.random() < p_cued else other
    return env.expert_action()
  return policy


@pytest.mark.parametrize("cued", [True, False])
def test_cue_decision_value_equals_monte_carlo_returns(cued):
  """cue=True: the paying arm is the task's and turn 0 shows it. decision_value(t, 'cued'/'uncued')
  is the mean return from turn t of sessions that followed / ignored the sign (n = 3000 over 60
  tasks, 4 standard errors), and first_decision reads the sign from the observation.
  Catches: the payoff tied to `left` whatever the sign (the uncued sessions that took left would
  be paid 0.95: ~40 se off), the cost charged to the arm rather than to the cued one, or a
  decision read from the action alone (half the 'cued' sessions would be keyed wrong)."""
  from mtrl_jax.envs import registry
  h, n = 5, 3000
  env = envs.make("delayed", horizon=h, noise=0.3, cue=True)
  decide = registry.first_decision_fn("delayed")
  rng = random.Random(1)
  rets, goods = [], set()
  for i in range(n):
    first = env.reset(i % 60, i).observation
    goods.add(env.good)
    rewards = []
    while not env.done:
      a = _cued(1.0 if cued else 0.0)(env, rng)
      if env.turn == 0:
        assert decide(a, first) == ("cued" if cued else "uncued")
      rewards.append(env.step(a).reward)
    rets.append(rewards)
  assert goods == {"left", "right"}  # the sign differs across tasks
  rets = np.array(rets)
  key = "cued" if cued else "uncued"
  for t in (0, 1, h - 1):
    mc = rets[:, t:].sum(1)
    se = mc.std(ddof=1) / math.sqrt(n)
    assert abs(mc.mean() - env.decision_value(t, key)) < 4 * se, (t, mc.mean(), env.decision_value(t, key))


def test_cue_shows_the_sign_and_demos_are_at_chance_given_it():
  """Terse and natural observations name the task's good arm (first_decision parses both); without
  a cue the observation and the strings are what they were (the study's records replay). Quality-0.5
  demos take the cued arm half the time whatever the sign (a warm start at chance at the decision).
  Catches: the sign drawn before the strings (a cue-less task's strings would change with the option
  off too: they are compared with cue=False's), or the suboptimal action fixed to `right`."""
  from mtrl_jax.envs.base import policy_action  # the demos' policy
  from mtrl_jax.envs.delayed import Delayed
  plain, cue = envs.make("delayed", horizon=4), envs.make("delayed", horizon=4, cue=True)
  for seed in range(20):
    assert plain.reset(seed, 0).observation == "left or right?"
    obs = cue.reset(seed, 0).observation
    assert obs == f"sign {cue.good}: left or right?" and cue.strings == plain.strings
    assert Delayed.first_decision(cue.good, obs) == "cued"
  nat = envs.make("delayed", horizon=4, cue=True, style="natural")
  obs = nat.reset(3, 0).observation
  assert nat.good in obs and Delayed.first_decision(nat.good, obs) == "cued"
  rng = random.Random(0)
  followed = {"left": [], "right": []}
  for seed in range(400):
    cue.reset(seed, 0)
    followed[cue.good].append(policy_action(cue, "expert", rng, quality=0.5) == cue.good)
  for arm, f in followed.items():
    assert abs(np.mean(f) - 0.5) < 0.1, (arm, np.mean(f))


def test_draw_seed_changes_the_hidden_draws_reproducibly():
  """draw_seed salts the per-session stream: the same (task, session) draws differently under
  another draw_seed, identically under the same one; 0 is the unsalted stream (records so far).
  Catches draw_seed ignored (eval draws equal across runs) or salting the 0 stream."""
  def draws(ds):
    env = envs.make("delayed", horizon=16, draw_seed=ds)
    return tuple(_play(env, 5, 2, _mixed(1.0), random.Random(0))[0])
  assert draws(0) == draws(0) and draws(7) == draws(7)
  assert draws(0) != draws(7) and draws(7) != draws(8)
  from mtrl_jax.envs.session_noise import noise_rng
  from mtrl_jax.envs.base import derive_seed
  assert noise_rng("delayed", 5, 2, False).random() == random.Random(derive_seed("delayed", "session", 5, 2)).random()
