"""TextWorld under every rollout path: lockstep, continuous batching, trees, async actors.

The sampler is host-only (no model): it says one of a few coin-collector commands, so some
sessions win, some stray, some say nothing admissible; what is checked is the engines' side
of the contract with the env (sessions finish, rewards and success are the env's, a tree's
forked sessions continue from their parent's game, actor threads play games in parallel).
"""
import sys
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("textworld")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rollout"))
from rollout_fixtures import TOK, ScriptedSampler  # noqa: E402
from mtrl_jax.envs import registry  # noqa: E402
from mtrl_jax.rollout.actors import ActorPool, ParamBoard  # noqa: E402
from mtrl_jax.rollout.continuous import ContinuousEngine  # noqa: E402
from mtrl_jax.rollout.engine import RolloutEngine  # noqa: E402
from mtrl_jax.rollout.staleness_queue import StalenessQueue  # noqa: E402
from mtrl_jax.rollout.tree import TreeRolloutEngine, TreeSpec  # noqa: E402
from textworld_fixtures import TINY  # noqa: E402

COMMANDS = ("go north", "go south", "go east", "go west", "take coin", "look", "sing")
registry.names()  # the built-ins registered on the main thread before env threads call make()


class CommandSampler(ScriptedSampler):
  """Says one of COMMANDS (uniformly, by the row's key), then eos."""

  params = None  # the weight-swap fields the actor pool reads

  def generate(self, state, rng, max_new_tokens, active=None, params=None):
    from types import SimpleNamespace
    gen = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel().tolist())
    n = len(state["rows"])
    active = np.ones(n, bool) if active is None else np.asarray(active)
    rows, tokens, logps = list(state["rows"]), [], []
    for b in range(n):
      ids = (TOK.encode(COMMANDS[gen.integers(len(COMMANDS))]) + [TOK.eos_id])[:max_new_tokens] if active[b] else []
      ids = ids[:max(state["capacity"] - len(rows[b]), 0)]
      rows[b] = rows[b] + tuple(ids)
      tokens.append(np.asarray(ids, np.int32))
      logps.append(np.full(len(ids), -np.log(len(COMMANDS)), np.float32))
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    hit = np.zeros(n, bool)
    return SimpleNamespace(tokens=tokens, logps=logps, hit_budget=hit, ended_by_capacity=hit.copy()), self.last_state

  def set_params(self, params, version):
    self.params, self.version = params, int(version)

  def copy_rows(self, state, src, dst):
    rows = list(state["rows"])
    for a, b in zip(src, dst):
      rows[b] = rows[a]
    self.last_state = {"rows": tuple(rows), "capacity": state["capacity"]}
    return self.last_state


def factory():
  knobs, games, eval_games = TINY["coin_collector"]
  return registry.make("textworld", kind="coin_collector", games=games, eval_games=eval_games,
                       max_turns=8, **knobs)


def _kw(group_size=4):
  return dict(group_size=group_size, turn_token_budget=16, context_cap=1024, num_env_threads=3,
              env_name="textworld")


def _check(sessions, n):
  assert len(sessions) == n
  assert all(s.done and not s.env_error for s in sessions), [s.error for s in sessions if s.env_error]
  for s in sessions:
    assert 1 <= s.num_turns <= 8
    assert s.success == (sum(t.reward for t in s.turns) == pytest.approx(1.0))
    assert s.success == s.terminated  # coin collector ends only by winning
  # Sessions of one task play the same game: their first observations agree.
  firsts = {}
  for s in sessions:
    firsts.setdefault(s.seed, set()).add(s.turns[0].observation)
  assert all(len(v) == 1 for v in firsts.values())


def test_lockstep_engine_plays_textworld():
  """The lockstep engine finishes every session of 3 tasks x 4 with the env's rewards; some win.

  Break checked: an env whose `step` raises on inadmissible commands (instead of counting them)
  ends sessions as env errors here; threads starting games at once without _TW_LOCK failed in
  textworld's logic parser (seen: every reset an EnvError).
  """
  res = RolloutEngine(CommandSampler(), TOK, factory, **_kw()).run([0, 1, 1_000_000], jax.random.key(0))
  _check(res.sessions, 12)
  res.ledger.check(res.sessions)
  assert any(s.success for s in res.sessions) and any(s.truncated for s in res.sessions)


def test_continuous_engine_plays_textworld():
  """Continuous batching (2 decode rows, 6 sessions in flight) with a real random tiny policy: every
  session ends (its bytes are no command: truncated at max_turns) and the ledger adds up.

  Break checked: as the lockstep test (an env error ends the session early, failing `_check`).
  """
  from flax import nnx
  from mtrl_jax.models.config import ModelConfig
  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.sampling.sampler import Sampler
  cfg = ModelConfig(vocab_size=264, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  sampler = Sampler.from_model(Transformer(cfg, rngs=nnx.Rngs(0)), pad_id=TOK.pad_id, stop_ids=[TOK.eos_id],
                               log_compiles=False)
  eng = ContinuousEngine(sampler, TOK, factory, rows=2, chunk=8, in_flight=6, **_kw(group_size=2))
  res = eng.run([0, 1_000_000, 5], jax.random.key(0))
  _check(res.sessions, 6)
  res.ledger.check(res.sessions)
  assert all(s.truncated or s.context_cap for s in res.sessions)


def test_trees_fork_textworld_games_by_replay():
  """A tree branching at turns 1 and 2 (4 leaves a root) forks each game by replaying its history:
  every leaf's turns up to its fork agree with its parent's, and the leaves then continue on
  their own.

  Break checked: `__deepcopy__` returning a fresh, un-replayed env makes a forked session play from
  the first room (its next observation differs from the parent's game) or fail on step.
  """
  eng = TreeRolloutEngine(CommandSampler(), TOK, factory, tree=TreeSpec(branch_turns=(1, 2), width=2), **_kw())
  res = eng.run([0, 2], jax.random.key(3))
  _check(res.sessions, 8)
  by_tree = {}
  for s in res.sessions:
    by_tree.setdefault(s.seed, []).append(s)
  for leaves in by_tree.values():
    first = [s.turns[0] for s in leaves if s.num_turns >= 2]
    assert len({(t.observation, t.action) for t in first}) == 1  # shared up to the first fork
  # The games went on after the forks: some leaf has a turn 3 whose observation follows its own action.
  assert max(s.num_turns for s in res.sessions) >= 3


def test_async_actors_play_textworld():
  """Two actor threads fill a staleness queue with a 3-task batch of textworld sessions.

  Break checked: starting games from a shared interpreter (no per-session game in _start) corrupts
  the sessions played at once by the two actors (env errors or mixed observations).
  """
  engine = RolloutEngine(CommandSampler(), TOK, factory, **_kw(group_size=2))
  q = StalenessQueue(eta=0, groups_per_update=3, max_chunk=1)
  pool = ActorPool(engine, q, ParamBoard({"w": jnp.zeros(2)}, 0), num_actors=2, groups_per_chunk=1, seed=0,
                   groups_per_update=3, batch_seeds=lambda k: [10 * k + j for j in range(3)])
  pool.start()
  try:
    batches = [q.get(timeout=300)]
  finally:
    assert pool.stop(30) == []
  for b in batches:
    _check(b.sessions, 6)
