"""The `textworld` env: walkthroughs win, determinism, disjoint splits, invalid commands, truncation, views."""
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("textworld")

from mtrl_jax import envs  # noqa: E402
from mtrl_jax.envs.textworld import HELD_OUT_SEEDS, pool as tw_pool, render  # noqa: E402
from textworld_fixtures import TINY, all_seeds, play, tiny_env  # noqa: E402

KINDS = sorted(TINY)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def tiny_pools():
  """One env per kind over its tiny pool (built on the first run, then read from the cache)."""
  return {kind: tiny_env(kind) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_the_walkthrough_wins_every_game_of_the_pool(tiny_pools, kind):
  """The expert (textworld's policy_commands; cooking reads the cookbook first) wins every training
  and evaluation game of the pool, in the plan's number of turns, never more than the recorded
  walkthrough's, and the normalised score deltas add up to exactly 1.

  Break checked: `success = state["lost"]` fails the success check; reward = the score itself (not
  its change) fails the return (cooking sums 1+2+...); `normalize` ignored fails it too.
  """
  env = tiny_pools[kind]
  for seed in all_seeds(env):
    env.reset(seed)
    planned = len(env.plan()) + (kind == "cooking")
    _, steps, actions = play(env, seed)
    assert steps[-1].terminated and steps[-1].info["success"], (kind, seed, actions)
    assert len(actions) == planned <= len(env.walkthrough()), (actions, env.walkthrough())
    assert kind != "cooking" or actions[0] == "examine cookbook" or "examine cookbook" in actions
    assert sum(s.reward for s in steps) == pytest.approx(1.0)
    assert not any(s.info["invalid_action"] for s in steps)


@pytest.mark.parametrize("kind", ["coin_collector", "cooking"])
def test_the_expert_replans_from_where_the_agent_strayed(tiny_pools, kind):
  """After three admissible non-expert commands (a detour), the expert still wins: its action comes
  from textworld's plan at the current state, not from the recorded walkthrough.

  Break checked: expert_action = the recorded walkthrough's command at the current turn fails here
  (it walks the wrong way or plays a command no longer admissible).
  """
  env = tiny_pools[kind]
  rng = random.Random(3)
  for seed in all_seeds(env)[:2]:
    env.reset(seed)
    for _ in range(3):
      env.step(env.suboptimal_action(rng))
    assert env.actions != env.walkthrough()[:3]
    for _ in range(60):
      out = env.step(env.expert_action())
      if out.terminated or out.truncated:
        break
    assert out.info["success"], (seed, env.actions)


def test_train_and_eval_games_come_from_disjoint_tw_make_seeds(tiny_pools):
  """Training task seeds play training games (tw-make seeds 0..games-1), held-out task seeds (where
  evaluation and the lab draw) play the evaluation games (seeds from 1,000,000): no game is in both,
  and the env's held-out range is the trainer's.

  Break checked: EVAL_GAME_SEED0 = 0 in pool.py makes the two seed sets overlap; game_path without
  its held-out branch sends evaluation seeds to training games.
  """
  from mtrl_jax.train.source import HELD_OUT_SEEDS as TRAIN_HELD_OUT, task_seeds
  assert HELD_OUT_SEEDS == TRAIN_HELD_OUT
  env = tiny_pools["coin_collector"]
  spec = env.spec
  assert not set(spec.train_seeds()) & set(spec.eval_seeds())
  tw_seed = lambda path: env.pool.records[path]["seed"]
  train_games = {env.game_path(s) for s in task_seeds(0, 3, 64)}
  eval_games = {env.game_path(s) for s in range(1_000_000, 1_000_064)}
  assert train_games == set(env.pool.train) and eval_games == set(env.pool.eval)
  assert {tw_seed(p) for p in train_games} == set(spec.train_seeds())
  assert {tw_seed(p) for p in eval_games} == set(spec.eval_seeds())
  assert not {tw_seed(p) for p in train_games} & {tw_seed(p) for p in eval_games}


def test_invalid_commands_are_counted_and_change_nothing(tiny_pools):
  """Commands the game does not list as admissible (gibberish, `quit`, `restart`, an exit that is not
  there) are counted as invalid, earn nothing, are not sent to the game, and the session goes on:
  the state (its key, the terse view) is unchanged and the expert still wins.

  Break checked: sending every command to the game (no admissibility check) fails on `restart`
  (the interpreter restarts, the tracked state diverges) and on the invalid flag.
  """
  env = tiny_pools["coin_collector"]
  env.reset(0)
  env.step(env.expert_action())
  key, view = env.state_key(), env.step("look").observation
  for bad in ("dance wildly", "quit", "restart", "go up", "", "take the moon"):
    out = env.step(bad)
    assert out.info["invalid_action"] and out.reward == 0.0 and not out.terminated
    assert out.info["turn_reward"] == 0.0 and out.observation.endswith("invalid command")
    assert env.state_key() == key and out.observation.split("\n")[0] == view.split("\n")[0]
  while not (out := env.step(env.expert_action())).terminated:
    pass
  assert out.info["success"]


def test_max_turns_truncates(tiny_pools):
  """A session that does not finish in max_turns is truncated there (invalid turns count), unsuccessful.

  Break checked: passing max_turns to nothing (the default 50) fails the turn count.
  """
  env = tiny_env("coin_collector", max_turns=4)
  env.reset(1)
  outs = [env.step(a) for a in ("look", "xyzzy", "inventory", "look")]
  assert [o.truncated for o in outs] == [False, False, False, True]
  assert not outs[-1].terminated and outs[-1].info["success"] is False
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("look")


def _transcript_script(data_dir: str, kind: str, seed: int) -> str:
  return textwrap.dedent(f"""
      import json, random
      from mtrl_jax import envs
      from textworld_fixtures import TINY
      knobs, games, eval_games = TINY[{kind!r}]
      env = envs.make("textworld", kind={kind!r}, games=1, eval_games=1, data_dir={data_dir!r}, workers=1, **knobs)
      rng = random.Random(5)
      first = env.reset({seed})
      out = [[first.prompt, first.observation, env.admissible()]]
      for i in range(12):
        a = env.expert_action() if i % 3 else env.random_action(rng)
        s = env.step(a)
        out.append([a, s.observation, s.reward, s.terminated, env.admissible() if not s.terminated else []])
        if s.terminated or s.truncated:
          break
      print(json.dumps(out))
  """)


@pytest.mark.parametrize("kind", ["coin_collector", "cooking"])
def test_a_game_is_the_same_in_two_processes(tiny_pools, tmp_path, kind):
  """Two processes play the game of tw-make seed 0 with the same commands (random and expert mixed):
  one builds it afresh in its own folder, the other reads the shared cache (built by another
  process earlier). Both see the same text, rewards and admissible commands.

  Break checked: building without `opts.seeds = seed` in pool.build_game (tw-make's seed left
  random) makes the fresh build's game differ from the cached one.
  """
  del tiny_pools  # the shared cache holds the game
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "envs")]))
  outs = []
  for folder in (str(tmp_path / "fresh"), ""):
    code = _transcript_script(folder, kind, 0)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
  assert outs[0] == outs[1]
  assert len(outs[0]) > 3 and any(len(t[-1]) > 2 for t in outs[0])


@pytest.mark.parametrize("kind", KINDS)
def test_the_terse_view_stays_within_its_bound(tiny_pools, kind):
  """Every terse observation of random and expert play is at most terse_chars long (the default 300,
  and 80, the smallest allowed), and it names the room and its exits.

  Break checked: dropping the final `_cut` of the state lines in render.terse lets cooking's kitchen
  (many visible objects) run past 80.
  """
  for limit in (render.TERSE_CHARS, 80):
    env = tiny_env(kind, terse_chars=limit)
    for seed in all_seeds(env)[:2]:
      for policy in ("expert", "random"):
        first, steps, _ = play(env, seed, policy=policy, rng_seed=seed, limit=25)
        views = [first.observation] + [s.observation for s in steps]
        assert all(len(v) <= limit for v in views), max(views, key=len)
        assert all(". exits: " in v for v in views), views


def test_terse_view_shows_doors_containers_and_food_states(tiny_pools):
  """Cooking's terse view names the closed door of an exit, a closed container, what lies on a
  supporter, and the cut / cooked state of carried food; the cookbook is one recipe line.

  Break checked: reading `north_of(a, b)` the wrong way round (exits of the neighbour) fails the
  exits the expert then takes; dropping FOOD_STATES fails the carried-food check.
  """
  env = tiny_pools["cooking"]
  seen = []
  for seed in all_seeds(env):
    first, steps, actions = play(env, seed)
    views = [first.observation] + [s.observation for s in steps]
    for a, v in zip(actions, views):
      if a.startswith("go "):
        assert a[3:] in v.split(" exits: ")[1].split(".")[0], (a, v)  # the exit taken was listed
    seen += views
    env.reset(seed)
    recipe = env.step("examine cookbook").observation if "examine cookbook" in env.admissible() else ""
    if recipe:
      assert "recipe: " in recipe and " do: " in recipe
  text = "\n".join(seen)
  assert "(closed)" in text
  import re
  assert re.search(r"carry: [^.\n]*\((sliced|diced|chopped|fried|roasted|grilled)", text), text
  assert "carry: " in text and "won" in text


def test_natural_style_is_the_game_text_without_banner_and_reads_replies_leniently():
  """style=natural passes the game's own text (the objective and the room), without the ASCII banner,
  the interpreter's status line or the restart question; a chatty reply naming one admissible
  command plays it; list_commands appends the admissible commands.

  Break checked: render.natural without its banner loop keeps the `$$$$` art; pick_command that
  only accepts exact replies makes "I will go ..." invalid.
  """
  env = tiny_env("coin_collector", style="natural", list_commands=True)
  first = env.reset(0)
  assert "$$" not in first.observation and "-= " in first.observation
  assert "text adventure" in first.prompt and "Commands: " in first.observation
  cmd = env.expert_action()
  out = env.step(f"I think I will {cmd}.")
  assert not out.info["invalid_action"] and env.actions == [f"I think I will {cmd}."]
  assert not out.observation.rstrip().endswith("=-") and "/" not in out.observation.split("\n")[0]
  assert env.step("Let me sing a song.").info["invalid_action"]
  while not (out := env.step(env.expert_action())).terminated:
    pass
  assert "Would you like to RESTART" not in out.observation and "The End" in out.observation


def test_pick_command_prefers_the_longest_named_command_and_refuses_ties():
  """`take knife from table` beats `take knife`; a reply naming two equally long commands is refused.

  Break checked: returning the first match instead of the longest fails the first assertion.
  """
  cmds = ["take knife", "take knife from table", "go east", "go west"]
  assert render.pick_command("I'll take knife from table now", cmds) == "take knife from table"
  assert render.pick_command("GO EAST.", cmds) == "go east"
  assert render.pick_command("go east or go west", cmds) == "go east or go west"


@pytest.mark.parametrize("kind", ["coin_collector", "cooking"])
def test_clone_and_replay_continue_identically(tiny_pools, kind):
  """A clone (replayed from the action history) continues exactly as the original does.

  Break checked: `clone` returning `self.fresh()` (no replay) fails the first comparison.
  """
  env = tiny_pools[kind]
  env.reset(1)
  rng = random.Random(0)
  for _ in range(3):
    env.step(env.random_action(rng))
  twin = env.clone()
  assert twin.state_key() == env.state_key() and twin.actions == env.actions
  for _ in range(4):
    a = env.expert_action()
    assert twin.expert_action() == a
    x, y = env.step(a), twin.step(a)
    assert (x.observation, x.reward, x.terminated) == (y.observation, y.reward, y.terminated)
    if x.terminated:
      break


def test_the_knobs_are_tw_makes_options_one_to_one():
  """Each kind's knobs are exactly the options its tw-make challenge declares, and the env takes
  each of them as a keyword argument.

  Break checked: dropping `drop` from KNOBS["cooking"] (or from the env's signature) fails.
  """
  import inspect
  params = set(inspect.signature(envs.registry._REGISTRY["textworld"]).parameters)
  for kind, challenge in tw_pool.CHALLENGES.items():
    assert set(tw_pool.KNOBS[kind]) == set(tw_pool.challenge_options(kind)), kind
    assert set(tw_pool.KNOBS[kind]) <= params
  assert tw_pool.parse_knobs("cooking", {"recipe": 3, "cut": True}) == {
      "recipe": 3, "take": 0, "go": 1, "open": False, "cook": False, "cut": True, "drop": False,
      "recipe_seed": 0, "split": None}
  assert (tw_pool.tw_make_line("cooking", tw_pool.parse_knobs("cooking", {"go": 6, "open": True}), 4)
          == "tw-make tw-cooking --recipe 1 --take 0 --go 6 --open --recipe-seed 0 --seed 4")
