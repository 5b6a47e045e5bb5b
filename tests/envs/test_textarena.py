"""The TextArena adapter: compact text, experts, copies, determinism across threads."""
import random
import sys
import threading

import pytest

from mtrl_jax import envs
from env_test_utils import continue_with, run_episode, success_rate

pytest.importorskip("textarena")
from mtrl_jax.envs.textarena import OFFLINE_GAMES  # noqa: E402

# Sokoban episodes are slow to generate (~0.2 s each, inside TextArena).
NAMED = {"FrozenLake-v0": 40, "TowerOfHanoi-v0": 20, "GuessTheNumber-v0": 40, "Sokoban-v0": 12}


@pytest.mark.parametrize("game,episodes", sorted(NAMED.items()))
def test_named_game_experts_win(game, episodes):
  env = envs.make("textarena", game=game)  # one env for all episodes: no state may leak
  assert success_rate(env, "expert", episodes, seed0=80) >= 0.95
  assert success_rate(env, "random", min(episodes, 10)) <= 0.5


def test_frozenlake_compact_text_and_rewards():
  env = envs.make("textarena", game="FrozenLake-v0", success_only=True)
  first = env.reset(0)
  assert len(first.prompt) < 90 and "[up]" in first.prompt
  rows = first.observation.splitlines()
  assert len(rows) == 4 and all(len(r) == 4 for r in rows) and rows[0][0] == "P"
  assert set(first.observation) <= set("PHG.\n")
  out = env.step("up")  # bare actions are bracketed; walking into the wall is invalid
  assert out.info["invalid_action"] and out.observation.endswith("invalid") and not out.terminated
  transcript, success = run_episode(env, 0)
  assert success and transcript[-1][2] == 1.0 and transcript[-1][1].endswith("won")
  assert all(len(t[1]) <= 40 for t in transcript[1:])


def test_compact_renderers_of_named_games():
  hanoi = envs.make("textarena", game="TowerOfHanoi-v0")
  assert hanoi.reset(0).observation == "A:321 B: C:"
  assert hanoi.step("A C").observation == "A:32 B: C:1"
  guess = envs.make("textarena", game="GuessTheNumber-v0")
  assert guess.reset(0).observation == "guess 1-20"
  assert guess.step(guess.expert_action()).observation in ("higher", "lower", "won")
  big = envs.make("textarena", game="FrozenLake-v0", game_kwargs={"size": 5, "num_holes": 4})
  assert [len(row) for row in big.reset(0).observation.splitlines()] == [5] * 5
  soko = envs.make("textarena", game="Sokoban-v0")
  board = soko.reset(0).observation.splitlines()
  assert len(board) == 4 and "P" in "".join(board) and "X" in "".join(board)


def test_full_text_mode_passes_textarena_text_through():
  env = envs.make("textarena", game="FrozenLake-v0", compact=False)
  first = env.reset(0)
  assert "Frozen Lake" in first.prompt and "Current Board" in first.observation


@pytest.mark.parametrize("game", ["FrozenLake-v0", "Sokoban-v0", "GuessTheNumber-v0"])
def test_clone_and_replay_continue_identically(game):
  env = envs.make("textarena", game=game)
  rng = random.Random(1)
  env.reset(11)
  for _ in range(2):
    out = env.step(env.random_action(rng) if game != "Sokoban-v0" else env.expert_action())
    if out.terminated or out.truncated:
      env.reset(11)
  clone, replayed = env.clone(), env.replay()
  assert clone._ta is not env._ta
  actions = [env.random_action(random.Random(5)) for _ in range(3)]
  a = continue_with(env, actions)
  assert a == continue_with(clone, actions) == continue_with(replayed, actions)


def test_same_seed_same_episode_and_seeds_differ():
  env = envs.make("textarena", game="FrozenLake-v0")
  assert run_episode(env, 3, "random") == run_episode(env, 3, "random")
  assert len({env.reset(s).observation for s in range(20)}) > 5


def test_global_rng_is_left_alone_and_threads_are_deterministic():
  random.seed(123)
  expected_next = random.Random(123).random()
  env = envs.make("textarena", game="GuessTheNumber-v0")
  run_episode(env, 0, "random")
  assert random.random() == expected_next  # TextArena's random.seed() did not leak

  def worker(seed, out):
    e = envs.make("textarena", game="FrozenLake-v0")
    out[seed] = [run_episode(e, seed + k, "random") for k in range(10)]

  serial = {}
  for s in range(4):
    worker(s * 100, serial)
  threaded = {}
  threads = [threading.Thread(target=worker, args=(s * 100, threaded)) for s in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert threaded == serial


@pytest.mark.parametrize("game", OFFLINE_GAMES)
def test_random_policy_runs_on_every_offline_game(game):
  env = envs.make("textarena", game=game, max_turns=12)
  transcript, _ = run_episode(env, 0, "random")
  assert 1 <= len(transcript) - 1 <= 12
  prompt, first = transcript[0]
  assert prompt and isinstance(first, str)
  assert "Please resubmit" not in "".join(t[1] for t in transcript[1:])  # boilerplate stripped


def test_games_without_an_expert_say_so():
  env = envs.make("textarena", game="Mastermind-v0")
  env.reset(0)
  with pytest.raises(NotImplementedError, match="no scripted expert.*FrozenLake"):
    env.expert_action()


def test_unsupported_games_fail_clearly():
  with pytest.raises(ValueError, match="unknown TextArena game 'Nope-v0'.*FrozenLake-v0"):
    envs.make("textarena", game="Nope-v0")
  with pytest.raises(ValueError, match="not a single-player game"):
    envs.make("textarena", game="TicTacToe-v0").reset(0)
  with pytest.raises(RuntimeError, match="NLTK.*not supported offline"):
    envs.make("textarena", game="Wordle-v0").reset(0)


def test_missing_textarena_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "textarena", None)  # `import textarena` now fails
  with pytest.raises(ImportError, match=r'pip install -e "\.\[textarena\]"'):
    envs.make("textarena", game="FrozenLake-v0")


def test_sokoban_expert_gives_up_a_lost_episode_instead_of_raising(monkeypatch):
  """A low-quality demo's detour can deadlock a box; the expert then has no plan. Catches the
  expert raising there (every quality<1 demo build on Sokoban died: 2026-11-27, the study's
  sokoban warm start) and it searching again on every later turn; an unsolvable *first* board
  still raises (the expert's limit, not a lost episode)."""
  from mtrl_jax.envs import textarena as ta_mod
  env = envs.make("textarena", game="Sokoban-v0")
  env.reset(0)
  first = env.expert_action()  # solvable start: a real plan
  env.step(first)
  calls = []
  monkeypatch.setattr(ta_mod, "_bfs_path", lambda *a, **k: calls.append(1))  # "no solution" from here on
  env._sokoban_plan = {}  # as after a detour off the plan
  assert env.expert_action() == "[up]"
  env.step("[up]")
  assert env.expert_action() == "[up]" and len(calls) == 1  # no second search
  env.reset(0)
  with pytest.raises(NotImplementedError, match="no solution"):
    env.expert_action()
