"""Critic estimators: gae, turn_gae, bilevel_gae, decoupled / adaptive lambda."""
import re

import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import functools

import jax

from credit_fixtures import random_sessions, run, run_traced, seeds, split_per_turn, to_batch
from mtrl_jax.credit import adaptive_lambda, compute_advantages, make_credit_batch
from mtrl_jax.credit.gae import _row_links, bilevel_gae, gae, turn_gae

# One session, 5 tokens: [a, a | obs | a] plus a leading observation token.
#   position  0    1    2    3    4
#   mask      0    1    1    0    1
#   turn      0    0    0    1    1
#   reward    0    0    1    0    2     (turn 0 pays 1, turn 1 pays 2)
#   value     9   .5    1    9  1.5     (9 on observation tokens: must be skipped)
_MASK = np.array([[0, 1, 1, 0, 1]], np.float32)
_TURN = np.array([[0, 0, 0, 1, 1]], np.int32)
_REW = np.array([[0, 0, 1, 0, 2]], np.float32)
_VAL = np.array([[9, 0.5, 1.0, 9, 1.5]], np.float32)


def _session():
  return make_credit_batch(_REW, _MASK, _TURN, value_bt=_VAL)


def _per_turn():
  # The same session as two rows (history context: turn 0's actions masked
  # in the turn-1 row), listed in reverse order on purpose.
  mask = np.array([[0, 0, 0, 0, 1], [0, 1, 1, 0, 0]], np.float32)
  return make_credit_batch(np.repeat(_REW, 2, 0), mask, np.repeat(_TURN, 2, 0),
                           episode_id_b=np.array([4, 4]), value_bt=np.repeat(_VAL, 2, 0))


def test_gae_hand_example_both_layouts():
  # gamma .9, lambda .5 (gamma*lambda = .45); action tokens 1 -> 2 -> 4.
  # d4 = 2 - 1.5 = .5                      A4 = .5
  # d2 = 1 + .9*1.5 - 1 = 1.35              A2 = 1.35 + .45*.5 = 1.575
  # d1 = 0 + .9*1 - .5 = .4                 A1 = .4 + .45*1.575 = 1.10875
  # Targets, lambda_critic 1: A4 = .5, A2 = 1.35 + .9*.5 = 1.8,
  #   A1 = .4 + .9*1.8 = 2.02 -> V + A = 2.0, 2.8, 2.52 (= discounted returns).
  adv, tgt = run("gae", _session(), gamma=0.9, lambda_policy=0.5)
  np.testing.assert_allclose(adv, [[0, 1.10875, 1.575, 0, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(tgt, [[0, 2.52, 2.8, 0, 2.0]], rtol=1e-6)
  adv2, tgt2 = run("gae", _per_turn(), gamma=0.9, lambda_policy=0.5)
  np.testing.assert_allclose(adv2, [[0, 0, 0, 0, 0.5], [0, 1.10875, 1.575, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(tgt2, [[0, 0, 0, 0, 2.0], [0, 2.52, 2.8, 0, 0]], rtol=1e-6)


def test_turn_gae_hand_example():
  # Turn values at first action tokens: V0 = .5 (pos 1), V1 = 1.5 (pos 4).
  # d1 = 2 - 1.5 = .5, A1 = .5; d0 = 1 + .9*1.5 - .5 = 1.85,
  # A0 = 1.85 + .45*.5 = 2.075. Targets (lambda 1): A1 = .5 -> 2.0;
  # A0 = 1.85 + .9*.5 = 2.3 -> 2.3 + .5 = 2.8.
  adv, tgt = run("turn_gae", _session(), gamma=0.9, lambda_policy=0.5)
  np.testing.assert_allclose(adv, [[0, 2.075, 2.075, 0, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(tgt, [[0, 2.8, 2.8, 0, 2.0]], rtol=1e-6)
  adv2, _ = run("turn_gae", _per_turn(), gamma=0.9, lambda_policy=0.5)
  np.testing.assert_allclose(adv2, [[0, 0, 0, 0, 0.5], [0, 2.075, 2.075, 0, 0]], rtol=1e-6)


def test_bilevel_gae_hand_example():
  # High level (gamma_turn .9, lambda .5), V at each turn's last action token:
  #   V0 = 1 (pos 2), V1 = 1.5 (pos 4).
  #   d1 = 2 - 1.5 = .5, A1 = .5, G1 = 2.0
  #   d0 = 1 + .9*1.5 - 1 = 1.35, A0 = 1.35 + .45*.5 = 1.575, G0 = 2.575
  # Low level (gamma 1, lambda .5) inside each turn:
  #   pos 4: G1 - V = 2 - 1.5 = .5;  pos 2: G0 - V = 1.575
  #   pos 1: d = 0 + 1*1 - .5 = .5, A = .5 + .5*1.575 = 1.2875
  # Targets (lambda 1 on both levels): high A0 = 1.35 + .9*.5 = 1.8 -> G0 = 2.8,
  #   G1 = 2.0; low level with lambda 1 telescopes to G on every turn token.
  adv, tgt = run("bilevel_gae", _session(), gamma=1.0, gamma_turn=0.9,
                                lambda_policy=0.5)
  np.testing.assert_allclose(adv, [[0, 1.2875, 1.575, 0, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(tgt, [[0, 2.8, 2.8, 0, 2.0]], rtol=1e-6)
  adv2, _ = run("bilevel_gae", _per_turn(), gamma=1.0, gamma_turn=0.9,
                               lambda_policy=0.5)
  np.testing.assert_allclose(adv2, [[0, 0, 0, 0, 0.5], [0, 1.2875, 1.575, 0, 0]], rtol=1e-6)


def test_length_adaptive_lambda_hand_values():
  # alpha .05: l=1000 -> 1 - 1/50 = .98; l=100 -> .8; l=20 -> 0; l=10 -> -1 -> 0; l=0 -> 0.
  got = adaptive_lambda(jnp.array([1000, 100, 20, 10, 0]), 0.05)
  np.testing.assert_allclose(got, [0.98, 0.8, 0.0, 0.0, 0.0], atol=1e-6)


def test_length_adaptive_lambda_default_alpha_is_vapo_value():
  # VAPO's alpha 0.05 is the default: l = 100 -> 1 - 1/5 = .8 (alpha 1.05
  # would give 1 - 1/105). Catches a changed default.
  np.testing.assert_allclose(adaptive_lambda(100), 0.8, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(0, 5000), alpha=st.sampled_from([0.01, 0.05, 0.1, 0.5, 2.0]))
def test_length_adaptive_lambda_formula(length, alpha):
  expect = 0.0 if length == 0 else min(max(1.0 - 1.0 / (alpha * length), 0.0), 1.0)
  np.testing.assert_allclose(adaptive_lambda(length, alpha), expect, atol=1e-6)


@functools.lru_cache(maxsize=None)
def _lambda_fn(name, **static):
  """jit(batch, lam) -> advantages with lambda_policy traced (one compile)."""
  return jax.jit(lambda b, lam: compute_advantages(name, b, lambda_policy=lam, **static)[0])


@settings(max_examples=25, deadline=None)
@given(seed=seeds, alpha=st.sampled_from([0.05, 0.2, 1.0]))
def test_length_adaptive_gae_uses_lambda_of_the_episode_length(seed, alpha):
  # One session per batch: the adaptive run must equal a fixed-lambda run
  # with lambda = 1 - 1/(alpha * number of action tokens), clamped.
  d = random_sessions(seed, b=1, t=12)
  n = d["loss_mask_bt"].sum()
  lam = float(np.clip(1 - 1 / (alpha * n), 0, 1))
  batch = to_batch(d)
  a1, _ = run("gae", batch, length_adaptive=True, alpha=alpha)
  a2 = _lambda_fn("gae")(batch, lam)
  np.testing.assert_allclose(a1, a2, rtol=1e-5, atol=1e-6)
  # turn_gae: l = number of turns.
  turns = len(set(d["turn_idx_bt"][0][d["loss_mask_bt"][0] > 0].tolist()))
  lam_t = float(np.clip(1 - 1 / (alpha * turns), 0, 1))
  a3, _ = run("turn_gae", batch, length_adaptive=True, alpha=alpha)
  a4 = _lambda_fn("turn_gae")(batch, lam_t)
  np.testing.assert_allclose(a3, a4, rtol=1e-5, atol=1e-6)


@jax.jit
def _gae_and_rlax(batch, gamma, lam):
  adv, tgt = compute_advantages("gae", batch, gamma=gamma, lambda_policy=lam,
                                lambda_critic=lam)
  t = batch.reward_bt.shape[1]
  # The episode ends after the last token. rlax's output at an action token
  # depends only on later positions, so its (meaningless) outputs on the
  # prompt tokens are simply not compared.
  discount = jnp.where(jnp.arange(t) == t - 1, 0.0, gamma)
  values = jnp.concatenate([batch.value_bt[0], jnp.zeros(1)])
  ref = rlax.truncated_generalized_advantage_estimation(
      batch.reward_bt[0], discount, lam, values)
  return adv[0], tgt[0], ref


@settings(max_examples=30, deadline=None)
@given(n_prompt=st.integers(0, 11), gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0),
       seed=seeds)
def test_gae_matches_rlax_on_single_turn_data(n_prompt, gamma, lam, seed):
  # One turn: n_prompt masked prompt tokens (0 = all action tokens), then
  # 16 - n_prompt action tokens, reward on the last one.
  t = 16
  rng = np.random.default_rng(seed)
  reward = np.zeros((1, t), np.float32)
  reward[0, -1] = rng.normal()
  value = rng.normal(size=(1, t)).astype(np.float32)
  mask = (np.arange(t) >= n_prompt).astype(np.float32)[None]
  batch = make_credit_batch(reward, mask, value_bt=value)
  adv, tgt, ref = _gae_and_rlax(batch, gamma, lam)
  act = slice(n_prompt, t)
  np.testing.assert_allclose(adv[act], ref[act], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tgt[act], ref[act] + value[0, act], rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(adv[:n_prompt]) == 0.0)


def _discounted_returns_over_action_tokens(d, gamma):
  out = np.zeros_like(d["reward_bt"])
  for i in range(out.shape[0]):
    g = 0.0
    for t in reversed(range(out.shape[1])):
      if d["loss_mask_bt"][i, t] > 0:
        g = d["reward_bt"][i, t] + gamma * g
        out[i, t] = g
  return out


@settings(max_examples=30, deadline=None)
@given(seed=seeds, gamma=st.sampled_from([1.0, 0.9, 0.5]))
def test_gae_with_lambda_one_and_zero_values_is_discounted_return(seed, gamma):
  d = random_sessions(seed)
  d["value_bt"] = np.zeros_like(d["value_bt"])
  hp = {"gamma": gamma, "lambda_policy": 1.0}
  adv, tgt = run_traced("gae", to_batch(d), hp)
  expect = _discounted_returns_over_action_tokens(d, gamma)
  np.testing.assert_allclose(adv, expect, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tgt, expect, rtol=1e-5, atol=1e-5)
  # Turn level: lambda 1, V 0 -> the raw per-turn return-to-go.
  adv_t, _ = run_traced("turn_gae", to_batch(d), hp)
  rtg, _ = run_traced("return_to_go", to_batch(d), {"gamma": gamma}, norm="none")
  np.testing.assert_allclose(adv_t, rtg, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_decoupled_lambdas(seed):
  # Targets follow lambda_critic alone; advantages follow lambda_policy alone.
  batch = to_batch(random_sessions(seed))
  for name in ("gae", "turn_gae", "bilevel_gae"):
    a_mix, t_mix = run_traced(name, batch, {"lambda_policy": 0.7, "lambda_critic": 1.0})
    a_p, _ = run_traced(name, batch, {"lambda_policy": 0.7, "lambda_critic": 0.7})
    _, t_c = run_traced(name, batch, {"lambda_policy": 1.0, "lambda_critic": 1.0})
    np.testing.assert_allclose(a_mix, a_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t_mix, t_c, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_critic_estimators_agree_across_layouts(seed):
  _assert_layouts_agree(random_sessions(seed), seed, ("gae", "turn_gae", "bilevel_gae", "return_to_go"))


@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_critic_estimators_agree_across_layouts_with_untrained_middle_turns(seed):
  """Turns without a trainable token in the middle of sessions (turn 1 of
  every row with three turns or more, loss mask 0 on its action tokens;
  e.g. a turn whose tokens a token filter masked). The session layout steps
  over them; the per-turn layout has no row for them, so gae must link the
  row of turn 0 to the row of turn 2. Fails with gae linking only turn
  j -> j + 1 (the chain broke at the gap: turn 0's advantage lost every
  later reward)."""
  d = random_sessions(seed)
  m = d["loss_mask_bt"] > 0
  gaps = 0
  for i in range(m.shape[0]):
    if len(set(d["turn_idx_bt"][i][m[i]].tolist())) >= 3:
      d["loss_mask_bt"][i][d["turn_idx_bt"][i] == 1] = 0.0
      gaps += 1
  assume(gaps > 0)
  _assert_layouts_agree(d, seed, ("gae", "turn_gae", "bilevel_gae"))


def _assert_layouts_agree(d, seed, names):
  per_turn, origin = split_per_turn(d, seed, pad_rows_to=72)
  for name in names:
    a_s, t_s = run_traced(name, to_batch(d), {"gamma": 0.9})
    a_p, t_p = run_traced(name, to_batch(per_turn), {"gamma": 0.9})
    a_s, a_p = np.asarray(a_s), np.asarray(a_p)
    for j, o in enumerate(origin):
      if o is None:
        assert np.all(a_p[j] == 0.0)
        continue
      m = per_turn["loss_mask_bt"][j] > 0
      np.testing.assert_allclose(a_p[j][m], a_s[o[0]][m], rtol=1e-4, atol=1e-5)
      if t_s is not None:
        np.testing.assert_allclose(np.asarray(t_p)[j][m], np.asarray(t_s)[o[0]][m],
                                   rtol=1e-4, atol=1e-5)


CRITIC_FNS = dict(gae=gae, turn_gae=turn_gae, bilevel_gae=bilevel_gae)
OUT_OF_RANGE = [("lambda_policy", 1.5), ("lambda_policy", -0.1), ("lambda_critic", 1.01),
                ("lambda_critic", -1.0), ("gamma", 1.5), ("gamma", -0.5), ("alpha", 0.0),
                ("alpha", -1.0)]


@pytest.mark.parametrize("name", CRITIC_FNS)
@pytest.mark.parametrize("option,value", OUT_OF_RANGE)
def test_critic_estimators_reject_out_of_range_options(name, option, value):
  """Lambdas and gamma outside [0, 1] and alpha <= 0 raise, naming the option
  and the value. Catches a check dropped (an argument passed as None) or a
  bound moved (alpha 0 accepted)."""
  with pytest.raises(ValueError, match=re.escape(f"{option} must") + ".*" + re.escape(repr(value))):
    CRITIC_FNS[name](_session(), **{option: value})


def test_bilevel_gae_rejects_out_of_range_gamma_turn():
  with pytest.raises(ValueError, match="gamma must .*1.5"):
    bilevel_gae(_session(), gamma_turn=1.5)


@pytest.mark.parametrize("name", CRITIC_FNS)
def test_critic_estimators_accept_the_closed_range_ends(name):
  """0 and 1 are valid lambdas / gammas and any alpha > 0 is valid (catches
  `<=` turned into `<` in the range check)."""
  for opts in (dict(lambda_policy=0.0, lambda_critic=1.0, gamma=0.0, alpha=1e-3),
               dict(lambda_policy=1.0, lambda_critic=0.0, gamma=1.0)):
    adv, _ = CRITIC_FNS[name](_session(), **opts)
    assert np.all(np.isfinite(np.asarray(adv)))


@pytest.mark.parametrize("name", CRITIC_FNS)
def test_critic_estimators_default_alpha_is_vapo_value(name):
  """length_adaptive without alpha uses alpha 0.05. On the hand session
  (3 action tokens, 2 turns) 0.05 clamps lambda to 0, while 1.05 gives
  lambda .52 to .68: the advantages differ by > .05. Catches a changed
  default alpha."""
  fn = CRITIC_FNS[name]
  a_default, _ = fn(_session(), gamma=0.9, length_adaptive=True)
  a_005, _ = fn(_session(), gamma=0.9, length_adaptive=True, alpha=0.05)
  a_105, _ = fn(_session(), gamma=0.9, length_adaptive=True, alpha=1.05)
  np.testing.assert_allclose(a_default, a_005, rtol=1e-6)
  assert np.max(np.abs(np.asarray(a_105) - np.asarray(a_005))) > 0.05


def test_bilevel_gae_length_adaptive_uses_turns_high_and_tokens_low():
  """alpha 1 on the hand session (2 turns, 3 action tokens): the turn level
  uses lambda 1 - 1/2 = .5, the token level 1 - 1/3 = 2/3.
  High (gamma_turn .9): A1 = .5, A0 = 1.35 + .9*.5*.5 = 1.575, G0 = 2.575.
  Low (gamma 1): pos 4: .5; pos 2: G0 - V = 1.575;
    pos 1: .5 + (2/3)*1.575 = 1.55.
  Catches length_adaptive not reaching the turn level (lambda .95 there
  gives A0 = 1.7775) or lengths swapped between the levels. A second
  session (one action token) in the same batch must not change the first
  one's numbers: counting the tokens of the whole batch (4) instead of the
  episode's (3) would give pos 1 = .5 + .75*1.575 = 1.68."""
  adv, _ = bilevel_gae(_session(), gamma=1.0, gamma_turn=0.9, length_adaptive=True,
                       alpha=1.0)
  np.testing.assert_allclose(adv, [[0, 1.55, 1.575, 0, 0.5]], rtol=1e-6)
  two = make_credit_batch(
      np.concatenate([_REW, [[0, 0, 0, 0, 1]]]), np.concatenate([_MASK, [[0, 0, 0, 0, 1]]]),
      np.concatenate([_TURN, np.zeros((1, 5), np.int32)]), episode_id_b=np.array([3, 8]),
      value_bt=np.concatenate([_VAL, np.full((1, 5), 0.25, np.float32)]))
  adv2, _ = bilevel_gae(two, gamma=1.0, gamma_turn=0.9, length_adaptive=True, alpha=1.0)
  np.testing.assert_allclose(adv2[0], [0, 1.55, 1.575, 0, 0.5], rtol=1e-6)


def test_turn_estimators_ignore_turns_from_max_turns_on():
  """max_turns=1 on the hand session: turn 1 (position 4) is ignored (its
  advantage is 0) and turn 0 becomes the last turn.
  turn_gae: A0 = r0 - V0 = 1 - .5 = .5 on positions 1, 2 (target .5 + .5).
  bilevel_gae (gamma 1, gamma_turn .9, lambda .5): A0 = 1 - V(pos 2) = 0,
    G0 = 1; pos 2: G0 - V = 0; pos 1: 0 + 1 - .5 + .5*0 = .5.
  Catches max_turns not passed on (turn 1 would count)."""
  adv, tgt = turn_gae(_session(), gamma=0.9, lambda_policy=0.5, max_turns=1)
  np.testing.assert_allclose(adv, [[0, 0.5, 0.5, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(tgt, [[0, 1.0, 1.0, 0, 0]], rtol=1e-6)
  adv, _ = bilevel_gae(_session(), gamma=1.0, gamma_turn=0.9, lambda_policy=0.5,
                       max_turns=1)
  np.testing.assert_allclose(adv, [[0, 0.5, 0, 0, 0]], rtol=1e-6, atol=1e-7)


def test_turn_gae_value_at_last_hand_example():
  """value_at='last': V0 = 1 (pos 2), V1 = 1.5 (pos 4).
  d1 = 2 - 1.5 = .5, A1 = .5; d0 = 1 + .9*1.5 - 1 = 1.35,
  A0 = 1.35 + .45*.5 = 1.575. Targets (lambda 1): A1 = .5 -> 2.0;
  A0 = 1.35 + .9*.5 = 1.8 -> 1.8 + 1 = 2.8.
  Catches value_at being ignored (the first token's value gives 2.075);
  bilevel_gae's hand example cannot, since its targets G do not depend on
  the turn's own value."""
  adv, tgt = turn_gae(_session(), gamma=0.9, lambda_policy=0.5, value_at="last")
  np.testing.assert_allclose(adv, [[0, 1.575, 1.575, 0, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(tgt, [[0, 2.8, 2.8, 0, 2.0]], rtol=1e-6)


def test_turn_estimators_reject_unknown_value_at():
  for fn in (turn_gae, bilevel_gae):
    with pytest.raises(ValueError, match="value_at must be one of .*'middle'"):
      fn(_session(), value_at="middle")


# _row_links: for each row of the per-turn layout, the row holding the next
# turn of its episode (-1: none). Its -1s for rows without a counted turn
# do not reach gae's outputs (those rows' advantages are masked), so the
# contract is checked on the helper itself.

# One compilation per (shape, K): the property test pads to a fixed shape.
_row_links_jit = jax.jit(_row_links, static_argnums=2)


def _links(mask, turn, episode_id, k):
  mask, turn = np.asarray(mask, np.float32), np.asarray(turn, np.int32)
  batch = make_credit_batch(np.zeros(mask.shape, np.float32), mask, turn,
                            episode_id_b=np.asarray(episode_id))
  ep_b = np.unique(np.asarray(episode_id), return_inverse=True)[1].astype(np.int32)
  return np.asarray(_row_links_jit(batch, jnp.asarray(ep_b), k))


def test_row_links_hand_example():
  """max_turns 3, two tokens per row. Episode 3 (rank 0): turns 0, 1, 2 in
  rows 2, 3, 1 (row 1 also holds turn 3 >= K, ignored) and turn 4 alone in
  row 6 (ignored). Episode 7 (rank 1): turns 0, 1 in rows 4, 0 and a row 5
  without trainable token. Episode 9: one row, turn 0.
  Checked to fail on (by hand on the first version of `_row_links`; the
  rewritten one that steps over untrainable turns lost no mutant to these
  tests, 2026-11-27): `has` taken over the whole batch or `has | ...` in
  `linked` (row 5 -> row 4); `nxt <= k` in `linked` (row 1, last turn K-1,
  -> row 4, the next episode's turn 0); -2 or +1 for an unlinked row (rows
  0, 7 / 1, 5, 6); turn 0 not counted (`> 0`, `>= 1`); turns outside [0, K)
  counted (`|`); the k_last fill +1."""
  mask = [[0, 1], [1, 1], [0, 1], [0, 1], [1, 0], [0, 0], [1, 1], [1, 1]]
  turn = [[0, 1], [2, 3], [0, 0], [0, 1], [0, 0], [0, 0], [4, 4], [0, 0]]
  ep = [7, 3, 3, 3, 7, 7, 3, 9]
  np.testing.assert_array_equal(_links(mask, turn, ep, 3), [-1, -1, 3, 1, 0, -1, -1, -1])


def test_row_links_last_episode_slot():
  """Two one-row episodes, max_turns 2: row 1 (last episode rank) holds turn
  0, so its next turn's slot is b * k - 1, the last real one, and empty:
  neither row has a successor. (On the first version this caught row_at
  sized b * k - 1; the rewrite reshapes row_at to [b, k], which fails to
  run at any other size.)"""
  np.testing.assert_array_equal(_links([[1], [1]], [[0], [0]], [0, 1], 2), [-1, -1])


def test_row_links_step_over_a_turn_without_trainable_token():
  """One episode, turns 0, 1, 2 in rows 2, 0, 1; turn 1 has no trainable
  token. Turn 0's row links to turn 2's row (the session layout steps over
  turn 1's masked tokens too). Fails with the link to turn j + 1 only
  (row 2 -> -1)."""
  mask = [[0, 0], [1, 1], [1, 0]]
  turn = [[1, 1], [2, 2], [0, 0]]
  np.testing.assert_array_equal(_links(mask, turn, [4, 4, 4], 3), [-1, -1, 1])


@st.composite
def _per_turn_layouts(draw):
  """Episodes split over rows, one turn per row, rows shuffled; any turn,
  first, middle or last, may have no trainable token (a row with mask 0),
  and episodes' turns may reach past max_turns. Padded with one-row
  episodes without trainable token to a fixed [15, 3] (one compilation)."""
  t = 3
  n_ep = draw(st.integers(1, 3))
  rows = []  # (episode id, turn, trainable)
  for e in range(n_ep):
    n_turns = draw(st.integers(1, 5))
    trainable = draw(st.lists(st.booleans(), min_size=n_turns, max_size=n_turns))
    rows += [(10 * e + 5, j, tr) for j, tr in enumerate(trainable)]
  order = draw(st.permutations(range(len(rows))))
  rows = [rows[i] for i in order]
  rows += [(100 + i, 0, False) for i in range(15 - len(rows))]
  k = draw(st.integers(1, 4))
  tok = [draw(st.lists(st.booleans(), min_size=t, max_size=t)) for _ in rows]
  mask = [[float(tr and (x or i == 0)) for i, x in enumerate(tk)]
          for (_, _, tr), tk in zip(rows, tok)]
  turn = [[j] * t for _, j, _ in rows]
  return mask, turn, [e for e, _, _ in rows], k, rows


@settings(max_examples=30, deadline=None)
@given(layout=_per_turn_layouts())
def test_row_links_match_next_turn_of_the_episode(layout):
  """Row of a trainable turn j < K -> the row of the same episode's next
  trainable turn j' in (j, K), stepping over turns without a trainable
  token; -1 if there is none, and for rows without a trainable token or of
  turns >= K. Checked to fail, on random orders and K, on the breaks of the
  hand example except two: turns outside [0, K) counted (a rare key
  collision) and row_at one slot short (the last episode rank is always a
  padding row here); the hand tests catch those. Also fails on the old link
  to turn j + 1 only (a middle turn without a trainable token broke the
  chain)."""
  mask, turn, ep, k, rows = layout
  where = {(e, j): i for i, (e, j, tr) in enumerate(rows) if tr and j < k}

  def next_row(e, j):
    later = [jj for (ee, jj) in where if ee == e and jj > j]
    return where[(e, min(later))] if later else -1

  want = [next_row(e, j) if (e, j) in where else -1 for e, j, _ in rows]
  np.testing.assert_array_equal(_links(mask, turn, ep, k), want)


def test_gae_max_turns_bounds_the_row_chain():
  """Per-turn layout (the hand session as two rows), gamma .9, lambda .5.
  max_turns=2 (the true count) changes nothing: turn 0's last token bootstraps
  from turn 1's row, A(pos 2) = 1 + .9 * 1.5 - 1 + .45 * (2 - 1.5) = 1.575,
  A(pos 1) = (0 + .9 * 1 - .5) + .45 * 1.575 = 1.10875. max_turns=1: turn 1 lies
  outside the chain, so turn 0 ends at pos 2: A = 1 - 1 = 0, A(pos 1) = .4.
  Catches max_turns ignored by gae (k = the row length: turn 1 stays linked) and
  max_turns not converted (gae never called with it before: mutants 17, 19)."""
  want_full = [[0, 0, 0, 0, 0.5], [0, 1.10875, 1.575, 0, 0]]
  for mt in (None, 2):
    adv, _ = gae(_per_turn(), gamma=0.9, lambda_policy=0.5, max_turns=mt)
    np.testing.assert_allclose(adv, want_full, rtol=1e-5)
  adv, _ = gae(_per_turn(), gamma=0.9, lambda_policy=0.5, max_turns=1)
  np.testing.assert_allclose(adv, [[0, 0, 0, 0, 0.5], [0, 0.4, 0, 0, 0]], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["gae", "turn_gae"])
def test_length_adaptive_lambda_is_per_episode_in_a_batch(name):
  """Two sessions of different lengths in one batch: each gets the adaptive
  lambda of its own length, so the batch equals each session run alone.
  Catches the token (or turn) count taken over the whole batch (one lambda for
  all, from the total length) instead of per row."""
  d = random_sessions(3, b=2, t=12)
  d["loss_mask_bt"][0, 6:] = 0  # make the two lengths differ
  assert d["loss_mask_bt"][0].sum() != d["loss_mask_bt"][1].sum()
  both, _ = run(name, to_batch(d), length_adaptive=True, alpha=1.0, gamma=0.9)
  for i in range(2):
    one = {k: (v[i:i + 1] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == 2 else v)
           for k, v in d.items()}
    alone, _ = run(name, to_batch(one), length_adaptive=True, alpha=1.0, gamma=0.9)
    np.testing.assert_allclose(np.asarray(both)[i], np.asarray(alone)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kw", [("gae", {}), ("gae", {"length_adaptive": True}), ("turn_gae", {}),
                                     ("bilevel_gae", {"length_adaptive": True})])
def test_critic_estimators_stay_float32_with_x64_on(name, kw):
  """Advantages and targets are float32 even when jax_enable_x64 is on (the learner's
  buffers are float32). Catches a dropped explicit dtype (jnp.zeros / full / asarray /
  astype with the default dtype, which is float64 under x64): without x64 such a
  change is invisible, which is why mutation testing found them."""
  batch = to_batch(random_sessions(1, b=3, t=12))
  jax.config.update("jax_enable_x64", True)
  try:
    adv, tgt = compute_advantages(name, batch, **kw)
    assert adv.dtype == jnp.float32 and tgt.dtype == jnp.float32, (adv.dtype, tgt.dtype)
  finally:
    jax.config.update("jax_enable_x64", False)
