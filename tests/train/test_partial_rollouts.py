"""Partial rollouts (`rollout.partial`): sessions in flight when new weights are
published continue under them, mid-action; per-token versions and behaviour
log-probs stay exact, and the decoupled loss trains on them as recorded."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tiny_world import G, TOK, SpreadEnv, host, learner, sessions_v0, world
from mtrl_jax.credit.losses import policy_loss
from mtrl_jax.rollout.actors import ActorSampler, ParamBoard
from mtrl_jax.rollout.continuous import ContinuousEngine
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.train.async_source import copy_params
from mtrl_jax.train.rl_step import forward

BUDGET, CHUNK, TASKS = 12, 3, [7, 8]


class PublishAfter:
  """An actor's sampler that publishes new weights on the board (as the learner
  would, from another thread) right after its `at`-th decode call."""

  def __init__(self, inner, board, at, params, version):
    self.inner, self.board, self.at, self.new = inner, board, at, (params, version)
    self.calls = 0

  def decode_rows(self, *a, **kw):
    out = self.inner.decode_rows(*a, **kw)
    self.calls += 1
    if self.calls == self.at:
      self.board.publish(*self.new)
    return out

  def __getattr__(self, name):
    return getattr(self.inner, name)


@pytest.fixture(scope="module")
def weights():
  """{version: params}: the initial policy (0) and the learner's after two updates (2)."""
  _, _, _, params0, _, _ = world()
  lrn = learner()
  for step, batch in enumerate([sessions_v0(1), sessions_v0(2)]):
    lrn.update(list(batch), step)
  assert lrn.version == 2
  return {0: copy_params(params0), 2: copy_params(lrn.policy_params_for_sampler())}


def _play(weights, partial: bool):
  _, _, _, _, sampler, _ = world()
  board = ParamBoard(weights[0], 0)
  actor = PublishAfter(ActorSampler(sampler, board, threading.Event()), board, 1, weights[2], 2)
  eng = ContinuousEngine(actor, TOK, SpreadEnv, group_size=G, turn_token_budget=BUDGET, context_cap=128,
                         num_env_threads=2, env_name="spread", rows=4, chunk=CHUNK, partial=partial)
  return eng.run(TASKS, jax.random.key(11)).sessions


def _replay_logps(sampler, weights, s) -> np.ndarray:
  """Each action token's log-prob, recomputed one token at a time with `append`
  and the weights its recorded version names: a token of version v was drawn
  from logits that weights v computed, i.e. the prefill of its turn's
  observation (first token) or the feed-back of the token before it. A turn's
  last token is fed back by the weights of its own version (the switch here
  is mid-action, so the call that drew it also fed it back)."""
  state = sampler.init_state(1, 128)
  out = []
  for t in s.turns:
    v = t.version.tolist()
    state = sampler.append(state, [t.obs_ids.tolist()], weights=weights[v[0]])
    for j, tok in enumerate(t.action_ids.tolist()):
      out.append(float(jax.nn.log_softmax(state.last_logits_bv[0])[tok]))
      state = sampler.append(state, [[tok]], weights=weights[v[j + 1] if j + 1 < len(v) else v[j]])
  return np.asarray(out)


def test_partial_sessions_switch_weights_mid_action_with_exact_versions(weights):
  """Weights 2 are published after the first decode call (3 steps into the
  first actions of the 4 sessions that have a row). With partial rollouts
  every session in flight moves to them: its first action holds version-0 then
  version-2 tokens (sessions started later hold version 2 only); each token's
  recorded behaviour log-prob equals a token-by-token replay with the weights
  its version names (to 1e-4), while a replay with the other version is off by
  far more. Without partial rollouts the same run keeps version 0 throughout
  and equals the lockstep engine's sessions at weights 0.

  Breaks checked: every token of a call stamped with the call's version (the
  first one's logits came from the call before): the replay is off for most
  tokens of the sessions that span the switch; `partial` ignored
  (`ContinuousEngine` always asking for the newest weights): the partial=False
  run has version-2 tokens; new weights never picked up (the engine keeps its
  run's weights with partial=True): no version-2 token.
  """
  _, _, _, _, sampler, _ = world()
  sessions = _play(weights, partial=True)
  # 4 rows: the sessions in a row at the first call (up to 4: those whose env
  # reset was back) span the switch within their first action, the others
  # start after it, on version 2 only.
  early = {s.session_id for s in sessions if s.turns[0].version[0] == 0}
  assert 1 <= len(early) <= 4
  for s in sessions:
    if s.session_id in early:
      assert set(s.turns[0].version.tolist()) == {0, 2}
    else:
      assert all(set(t.version.tolist()) == {2} for t in s.turns)
  for s in sessions:
    v = np.concatenate([t.version for t in s.turns])
    assert np.all(np.diff(v) >= 0) and v[-1] == 2
    rec = np.concatenate([t.logp for t in s.turns])
    np.testing.assert_allclose(rec, _replay_logps(sampler, weights, s), atol=1e-4)
    wrong = {0: weights[2], 2: weights[0]}  # each token replayed with the other version's weights
    assert np.abs(rec - _replay_logps(sampler, wrong, s)).max() > 0.05

  frozen = _play(weights, partial=False)
  assert {int(x) for s in frozen for t in s.turns for x in t.version} == {0}
  sampler.set_params(weights[0], 0)
  ref = RolloutEngine(sampler, TOK, SpreadEnv, group_size=G, turn_token_budget=BUDGET, context_cap=128,
                      num_env_threads=2, env_name="spread").run(TASKS, jax.random.key(11)).sessions
  for a, b in zip(ref, frozen):
    assert [t.action_ids.tolist() for t in a.turns] == [t.action_ids.tolist() for t in b.turns]
    np.testing.assert_allclose(np.concatenate([t.logp for t in a.turns]),
                               np.concatenate([t.logp for t in b.turns]), atol=1e-5)


def test_decoupled_loss_on_sessions_that_span_the_switch(weights):
  """The learner at version 2 trains on the partial sessions: it reports
  staleness 2 (the oldest token's version, not the newest), and its loss is
  the decoupled loss computed by hand with the recorded per-token behaviour
  log-probs (and not the one with behaviour = proximal). The importance weights
  pi_prox / pi_behav are near 1 on version-2 tokens (behaviour ~ the
  learner's own weights) and far from 1 on version-0 tokens.

  Break checked: the engine decoding with the run's first weights while
  stamping the newest version (`weights=(first params, newest version)` in
  `_Play._decode`): mean |log w| is 0.108 on version-2 tokens against 0.114 on
  version-0 ones, no longer under a quarter of it.
  """
  sessions = _play(weights, partial=True)
  lrn = learner()
  for step, batch in enumerate([sessions_v0(1), sessions_v0(2)]):
    lrn.update(list(batch), step)
  pb = lrn._pack(sessions)
  prox, ref, values = (np.asarray(x) for x in lrn.score(pb))
  m = pb.loss_mask_bt > 0
  behav = pb.behav_logp_bt
  log_w = np.abs(prox - behav)
  new, old = m & (pb.version_bt == 2), m & (pb.version_bt == 0)
  assert new.sum() > old.sum() > 0
  assert log_w[new].mean() < 0.25 * log_w[old].mean(), (log_w[new].mean(), log_w[old].mean())

  # The learner's loss = the decoupled loss by hand with the recorded behaviour.
  adv = np.asarray(lrn.advantages(pb, jnp.asarray(values), jnp.asarray(prox), jnp.asarray(ref))[0])
  params = host(lrn.state.policy)
  stats, _ = forward(lrn.policy_gd, params, jnp.asarray(pb.tokens_bt), jnp.asarray(pb.targets_bt),
                     jnp.asarray(pb.positions_bt))

  def hand_loss(behav_bt):
    loss, _ = policy_loss(lrn.loss_cfg, stats.logp_bt, jnp.asarray(behav_bt), jnp.asarray(adv),
                          jnp.asarray(pb.loss_mask_bt), prox_logp_bt=jnp.asarray(prox),
                          entropy_bt=stats.entropy_bt)
    return float(loss)

  assert np.abs(adv[m]).max() > 0.1
  met = lrn.update(sessions, 2)
  assert met["update/staleness_max"] == 2.0
  loss = hand_loss(behav)
  np.testing.assert_allclose(met["total_loss"], loss, rtol=1e-4, atol=1e-6)
  # Were every token's behaviour the proximal one (no version mix), the loss would differ.
  assert abs(hand_loss(prox) - loss) > 100 * abs(met["total_loss"] - loss)


def test_the_actor_pool_plays_the_continuous_engine():
  """`AsyncSource` over a `ContinuousEngine` (2 rows, group prefill): at
  eta = 0 with one actor playing whole batches, each update's sessions equal
  `SyncSource` with the lockstep engine (the pool changes who plays, not
  what), and the info carries what only the engine counted (prefill saved,
  decode row steps), summed over the groups' metas.

  Break checked: the actors' group meta without `prefill_saved`: the info
  has no prefill saving (KeyError) and would count the records' prefill.
  """
  from mtrl_jax.train.async_source import AsyncSource
  from mtrl_jax.train.source import SyncSource
  _, _, _, params, sampler, engine = world()
  sampler.set_params(copy_params(params), 0)
  sync = SyncSource(RolloutEngine(sampler, TOK, SpreadEnv, group_size=G, turn_token_budget=BUDGET,
                                  context_cap=128, num_env_threads=2, env_name="spread"), seed=3,
                    tasks_per_update=2)
  ref = [sync.next_batch(step) for step in range(2)]
  cont = ContinuousEngine(sampler, TOK, SpreadEnv, group_size=G, turn_token_budget=BUDGET, context_cap=128,
                          num_env_threads=2, env_name="spread", rows=2, chunk=CHUNK, group_prefill=True)
  with AsyncSource(cont, params=params, version=0, seed=3, tasks_per_update=2, eta=0, actors=1,
                   groups_per_chunk=2) as src:
    for step in range(2):
      src.publish(params, 0)
      sessions, info = src.next_batch(step)
      ref_sessions, ref_info = ref[step]
      for a, b in zip(ref_sessions, sessions):
        assert [t.action_ids.tolist() for t in a.turns] == [t.action_ids.tolist() for t in b.turns]
        np.testing.assert_allclose(np.concatenate([t.logp for t in a.turns]),
                                   np.concatenate([t.logp for t in b.turns]), atol=1e-5)
      first = sum(len(s.turns[0].obs_ids) for s in sessions)
      assert info["ledger/tokens_prefill_saved"] == first * (G - 1) // G
      assert info["ledger/tokens_prefilled"] == ref_info["ledger/tokens_prefilled"] - first * (G - 1) // G
      assert 0.5 < info["ledger/slot_utilisation"] <= 1.0


class PublishAfterGenerate(PublishAfter):
  """The same, after the `at`-th lockstep `generate` call."""

  def generate(self, *a, **kw):
    out = self.inner.generate(*a, **kw)
    self.calls += 1
    if self.calls == self.at:
      self.board.publish(*self.new)
    return out


def test_lockstep_actor_stamps_the_turn_after_a_publish_exactly(weights):
  """The lockstep engine in the actor pool moves to new weights between
  turns. Weights 2 are published right after turn 0's generate call: turn 0
  is version 0, turn 1 on version 2, and every token's behaviour log-prob
  equals the token-by-token replay with the weights its version names,
  including turn 1's first token, drawn from the logits of turn 1's prefill.

  Break checked: the engine reading the version after the prefill (as it
  did): the prefill runs on weights 0, the turn is stamped 2, and the replay
  of each turn-1 first token is off.
  """
  _, _, _, _, sampler, _ = world()
  board = ParamBoard(weights[0], 0)
  actor = PublishAfterGenerate(ActorSampler(sampler, board, threading.Event()), board, 1, weights[2], 2)
  eng = RolloutEngine(actor, TOK, SpreadEnv, group_size=G, turn_token_budget=BUDGET, context_cap=128,
                      num_env_threads=2, env_name="spread")
  sessions = eng.run(TASKS, jax.random.key(11)).sessions
  for s in sessions:
    assert [set(t.version.tolist()) for t in s.turns] == [{0}, {2}]
    np.testing.assert_allclose(np.concatenate([t.logp for t in s.turns]), _replay_logps(sampler, weights, s),
                               atol=1e-4)
