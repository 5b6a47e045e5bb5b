"""Tree rollouts with the real sampler: forks at any turn keep the env, the
cache and the records consistent, and the ledger counts shared tokens once."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.envs import registry
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer, token_logprobs
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.packing import pack_sessions
from mtrl_jax.rollout.tree import TreeRolloutEngine, TreeSpec
from rollout_fixtures import (LoggedDelayed, ResetLog, ScriptedSampler, assert_reset_with_session_ids,
                              rewards_by_session)

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
ENV_KW = {"length": 2}  # 4 turns: choice, 2 distractors, answer
registry.names()


@pytest.fixture(scope="module")
def policy():
  return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(policy):
  from mtrl_jax.sampling.sampler import Sampler
  return Sampler.from_model(policy, pad_id=TOK.pad_id, stop_ids=[TOK.eos_id], log_compiles=False)


def _engine(sampler, spec, group_size=4, cls=TreeRolloutEngine, **kw):
  factory = functools.partial(registry.make, "memory", **ENV_KW)
  extra = {"tree": spec} if cls is TreeRolloutEngine else {}
  return cls(sampler, TOK, factory, group_size=group_size, turn_token_budget=6, context_cap=192,
             num_env_threads=2, env_name="memory", **extra, **kw)


def _check_env_replay(s):
  """Replaying the recorded actions on a fresh env gives the recorded observations and rewards."""
  env = registry.make("memory", **ENV_KW)
  out = env.reset(s.seed)
  assert out.observation == s.turns[0].observation and out.prompt == s.prompt
  for k, t in enumerate(s.turns):
    step = env.step(t.action)
    assert step.reward == t.reward, (s.session_id, k)
    nxt = s.turns[k + 1].observation if k + 1 < s.num_turns else s.final_observation
    assert step.observation == nxt, (s.session_id, k)


def _check_logps(policy, sessions):
  """Behaviour log-probs equal a cache-free forward over each session's tokens:
  a child whose cache row was copied wrong (or not at all) fails here."""
  batch = pack_sessions(sessions)
  logits, _ = policy(jnp.asarray(batch.tokens_bt))
  logp_bt = np.asarray(token_logprobs(logits, jnp.asarray(batch.targets_bt)))
  m = batch.loss_mask_bt == 1
  np.testing.assert_allclose(logp_bt[m], batch.behav_logp_bt[m], atol=2e-4)


@pytest.mark.parametrize("turn", [0, 1, 2, 3])
def test_fork_at_any_turn_keeps_env_cache_and_records_consistent(policy, sampler, turn):
  """Width-4 fork at `turn` of a 4-turn env, 2 tasks. Catches: a child whose
  env is shared with (not cloned from) its parent (replay or rewards break),
  a cache row not copied (log-probs break), wrong tree ids or parents, shared
  turns that differ from the parent's, and a ledger that counts the shared
  prefix per child."""
  res = _engine(sampler, TreeSpec((turn,), 4)).run([11, 12], jax.random.key(turn))
  ss = res.sessions
  assert len(ss) == 8
  by_id = {s.session_id: s for s in ss}
  for i in range(2):
    group = ss[i * 4:(i + 1) * 4]
    root = group[0]
    assert root.branch_of is None and root.node_id == 0 and root.tree_id == root.session_id
    assert {s.group_id for s in group} == {root.group_id} and {s.tree_id for s in group} == {root.session_id}
    assert sorted(s.node_id for s in group) == [0, 1, 2, 3]
    for s in group[1:]:
      assert s.branch_of == (root.session_id, turn)
      for a, b in zip(s.turns[:turn], root.turns[:turn]):
        np.testing.assert_array_equal(a.action_ids, b.action_ids)
        np.testing.assert_array_equal(a.obs_ids, b.obs_ids)
        np.testing.assert_array_equal(a.logp, b.logp)
      np.testing.assert_array_equal(s.turns[turn].obs_ids, root.turns[turn].obs_ids)
    # Siblings sample their own actions from the fork on.
    assert len({tuple(s.turns[turn].action_ids) for s in group}) > 1
  for s in ss:
    assert s.done and s.num_turns == 4 and s.session_id in by_id
    _check_env_replay(s)
  _check_logps(policy, ss)
  res.ledger.check(ss)
  shared_obs = sum(len(s.turns[k].obs_ids) for s in ss if s.branch_of for k in range(turn + 1))
  shared_act = sum(len(s.turns[k].action_ids) for s in ss if s.branch_of for k in range(turn))
  naive = TokenLedger()
  for s in ss:
    for k, t in enumerate(s.turns):
      naive.record_prefill(k, len(t.obs_ids))
      naive.record_generated(k, len(t.action_ids))
  assert res.ledger.prefilled_total == naive.prefilled_total - shared_obs
  assert res.ledger.generated_total == naive.generated_total - shared_act


def test_two_level_tree_layout_and_savings(policy, sampler):
  """Branch at turns 1 and 2, width 2, 2 roots per task (G = 8): nested
  parents, node ids, and fewer tokens per session than chains of the same
  tasks. Catches a stride error in the row layout (a row taken twice raises)
  and children forked from the wrong parent (shared turns differ)."""
  res = _engine(sampler, TreeSpec((2, 1), 2), group_size=8).run([3], jax.random.key(5))
  ss = res.sessions
  assert len(ss) == 8 and len({s.tree_id for s in ss}) == 2
  by_id = {s.session_id: s for s in ss}
  for s in ss:
    if s.branch_of is not None:
      parent, turn = by_id[s.branch_of[0]], s.branch_of[1]
      assert turn in (1, 2) and parent.tree_id == s.tree_id
      for a, b in zip(s.turns[:turn], parent.turns[:turn]):
        np.testing.assert_array_equal(a.action_ids, b.action_ids)
  assert sorted(s.branch_of[1] for s in ss if s.branch_of) == [1, 1, 2, 2, 2, 2]
  _check_logps(policy, ss)
  res.ledger.check(ss)
  chains = _engine(sampler, None, group_size=8, cls=RolloutEngine).run([3], jax.random.key(5))
  per_tree = (res.ledger.generated_total + res.ledger.prefilled_total) / len(ss)
  per_chain = (chains.ledger.generated_total + chains.ledger.prefilled_total) / len(chains.sessions)
  assert per_tree < 0.8 * per_chain


def test_every_root_reset_gets_its_session_id_and_a_per_session_probe_repeats():
  """Host-only (scripted sampler): trees of `delayed` (per-session noise, envs/session_noise.py),
  2 roots of 2 leaves per task forking at turn 1. Every root's env reset receives its task seed
  and its own session id (the forks are clones: no reset); two runs at one key give the same
  rewards; the two roots of a task (one seed) draw different noise.
  Break checked: the tree engine resetting a root without its session id
  (`env.reset(s.seed)`) fails the reset log, and the equality of the two runs on its own."""
  runs = []
  for _ in range(2):
    log = ResetLog()
    engine = TreeRolloutEngine(ScriptedSampler(), TOK, lambda: LoggedDelayed(log), group_size=4,
                               tree=TreeSpec((1,), 2), turn_token_budget=3, context_cap=256, num_env_threads=3)
    sessions = engine.run([21, 22, 23], jax.random.key(4)).sessions
    assert len(sessions) == 12 and sum(s.branch_of is None for s in sessions) == 6
    assert_reset_with_session_ids(log, sessions)
    runs.append(rewards_by_session(sessions))
  assert runs[0] == runs[1]
  assert all(len(r) == 4 for r in runs[0].values())
  roots = sorted(s.session_id for s in sessions if s.branch_of is None)
  assert any(runs[0][a] != runs[0][b] for a, b in zip(roots[::2], roots[1::2]))


@pytest.mark.parametrize("shared", [False, True])
def test_forked_children_redraw_the_unseen_future_unless_draws_are_shared(shared):
  """Host-only: trees of `delayed` (noise 0.5 a turn and a payoff drawn as the session goes), 2 roots
  of 2 leaves per task forking at turn 1. Every reply is a digit string, so every session plays
  the same arm and any difference between siblings' rewards comes from the env's draws. Default:
  the children's rewards from the fork on are not all their parent's (each redraws its future from
  its own seed), and two runs agree; shared_draws=True: every child sees its parent's exact future.
  Break checked: without the redraw in TreeRolloutEngine._branch (a deep copy shares the parent's
  stream) all 6 children repeat their parent's rewards and the default case fails."""
  runs = []
  for _ in range(2):
    engine = TreeRolloutEngine(ScriptedSampler(), TOK, lambda: LoggedDelayed(ResetLog()), group_size=4,
                               tree=TreeSpec((1,), 2, shared_draws=shared), turn_token_budget=3,
                               context_cap=256, num_env_threads=3)
    runs.append(engine.run([21, 22, 23], jax.random.key(4)).sessions)
  sessions = runs[0]
  assert rewards_by_session(runs[0]) == rewards_by_session(runs[1])
  by_id = {s.session_id: s for s in sessions}
  children = [s for s in sessions if s.branch_of is not None]
  assert len(children) == 6
  same = [[t.reward for t in c.turns[1:]] == [t.reward for t in by_id[c.branch_of[0]].turns[1:]]
          for c in children]
  assert all(same) if shared else not all(same), same


def test_tree_spec_validation():
  with pytest.raises(ValueError, match="multiple"):
    TreeSpec((1,), 3).roots(4)
  with pytest.raises(ValueError, match="distinct"):
    TreeSpec((1, 1), 2)
  assert TreeSpec((3, 1), 2).branch_turns == (1, 3) and TreeSpec((3, 1), 2).roots(8) == 2


def test_actor_pool_plays_the_same_trees_as_the_synchronous_engine(policy, sampler):
  """The async source (two actors, one group per ticket, eta 0) with a tree
  engine as its template hands over whole trees, and they are the trees the
  synchronous source plays: same session ids, tree ids, parents and fork
  turns, tokens and behaviour log-probs. Catches an actor pool that copies
  the template into a chain engine (no tree ids, no parents), or that plays
  the leaves of a tree in different tickets (trees split, ids differ)."""
  from mtrl_jax.train.async_source import AsyncSource
  from mtrl_jax.train.source import SyncSource
  spec, g, tasks = TreeSpec((1,), 2), 4, 2  # two trees of two leaves per task
  sync_engine = _engine(sampler, spec, group_size=g)
  sync_engine.next_group_id = sync_engine.next_session_id = 0
  want, _ = SyncSource(sync_engine, seed=0, tasks_per_update=tasks).next_batch(0)
  with AsyncSource(_engine(sampler, spec, group_size=g), params=sampler.params, version=sampler.version, seed=0,
                   tasks_per_update=tasks, eta=0, actors=2, groups_per_chunk=1) as src:
    src.publish(sampler.params, sampler.version)
    got, info = src.next_batch(0)
  assert len(got) == len(want) == tasks * g
  assert len({s.tree_id for s in got}) == tasks * spec.roots(g)
  assert sum(s.branch_of is not None for s in got) == tasks * spec.roots(g)  # one child per tree
  key = lambda s: (s.group_id, s.session_id)
  for x, y in zip(sorted(got, key=key), sorted(want, key=key)):
    assert (x.session_id, x.group_id, x.tree_id, x.branch_of, x.seed) == (y.session_id, y.group_id, y.tree_id,
                                                                         y.branch_of, y.seed)
    np.testing.assert_array_equal(x.flat_tokens(), y.flat_tokens())
    np.testing.assert_allclose(x.flat_logp(), y.flat_logp(), atol=1e-5)
  _check_logps(policy, got)
