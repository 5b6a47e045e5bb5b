"""The TextWorld game pool: the cache (hit, corrupt, rebuilt) and every bad input's error."""
import builtins
import json
import os
import shutil

import pytest

pytest.importorskip("textworld")

from mtrl_jax import envs  # noqa: E402
from mtrl_jax.envs.textworld import pool as tw_pool  # noqa: E402
from textworld_fixtures import TINY, tiny_env  # noqa: E402


@pytest.fixture(scope="module")
def cached_coin():
  """The tiny coin-collector pool (built once, then cached)."""
  return tiny_env("coin_collector").pool


@pytest.fixture
def copied(cached_coin, tmp_path, monkeypatch):
  """A private copy of the cached pool folder under tmp_path, and a recorder of every game built."""
  folder = tmp_path / os.path.basename(cached_coin.folder)
  shutil.copytree(cached_coin.folder, folder, ignore=shutil.ignore_patterns(".lock"))
  built = []
  real = tw_pool.build_game

  def spy(kind, settings, seed, where):
    built.append(seed)
    return real(kind, settings, seed, where)

  monkeypatch.setattr(tw_pool, "build_game", spy)
  tw_pool.forget_pools()
  yield str(tmp_path), str(folder), cached_coin.spec, built
  tw_pool.forget_pools()


def test_a_cached_pool_is_read_not_rebuilt(copied):
  """Loading a complete pool builds nothing and gives its games in seed order, each matching its sidecar.

  Break checked: check_game always answering 'missing' rebuilds every game (the spy records them).
  """
  data_dir, folder, spec, built = copied
  pool = tw_pool.load_pool(spec, data_dir, workers=1)
  assert built == [] and pool.folder == folder
  assert [pool.records[p]["seed"] for p in pool.train] == spec.train_seeds()
  assert all(tw_pool.check_game(folder, s)[0] == "ok" for s in spec.train_seeds() + spec.eval_seeds())


@pytest.mark.parametrize("damage", ["truncated", "flipped", "sidecar", "no_sidecar"])
def test_a_corrupt_cached_game_is_rebuilt_not_trusted(copied, damage):
  """A game whose .z8 is truncated or has a flipped byte, whose sidecar is garbage or missing, is
  rebuilt (only that game), and the rebuilt files are the ones the sidecar vouches for; the env then
  plays it to a win.

  Break checked: check_game trusting a present sidecar without comparing hashes passes the truncated
  and flipped games through (the spy sees no rebuild, and the env fails to start the game).
  """
  data_dir, folder, spec, built = copied
  z8, _, side = tw_pool.game_paths(folder, 1)
  if damage == "truncated":
    with open(z8, "r+b") as f:
      f.truncate(1000)
  elif damage == "flipped":
    with open(z8, "r+b") as f:
      f.seek(5000)
      b = f.read(1)
      f.seek(5000)
      f.write(bytes([b[0] ^ 0xFF]))
  elif damage == "sidecar":
    with open(side, "w") as f:
      f.write("{not json")
  else:
    os.remove(side)
  assert tw_pool.check_game(folder, 1)[0] == ("missing" if damage == "no_sidecar" else "corrupt")
  pool = tw_pool.load_pool(spec, data_dir, workers=1)
  assert built == [1]
  assert tw_pool.check_game(folder, 1)[0] == "ok"
  knobs, games, eval_games = TINY["coin_collector"]
  env = envs.make("textworld", kind="coin_collector", games=games, eval_games=eval_games, data_dir=data_dir,
                  **knobs)
  assert env.pool is pool
  env.reset(1)
  while not (out := env.step(env.expert_action())).terminated:
    pass
  assert out.info["success"]


def test_a_game_interrupted_mid_write_is_rebuilt(copied):
  """A build killed after moving the .z8 but before its sidecar (the files of a new build beside a
  stale sidecar are impossible: the sidecar is removed first) leaves a game that is rebuilt.

  Break checked: writing the sidecar before the files in build_game would let the killed build's
  half-written game pass (simulated here as a sidecar without its .json).
  """
  data_dir, folder, spec, built = copied
  _, js, _ = tw_pool.game_paths(folder, 0)
  os.remove(js)
  assert tw_pool.check_game(folder, 0)[0] == "corrupt"
  tw_pool.load_pool(spec, data_dir, workers=1)
  assert built == [0] and tw_pool.check_game(folder, 0)[0] == "ok"


def test_unknown_kind_names_the_kinds():
  """Break checked: without check_kind the error is a KeyError naming only the bad kind."""
  with pytest.raises(ValueError, match=r"unknown kind 'coin'.*coin_collector, treasure_hunter, cooking"):
    envs.make("textworld", kind="coin")


def test_a_knob_of_another_kind_is_named():
  """Break checked: dropping the foreign-knob check lets `level` pass silently into a cooking pool."""
  with pytest.raises(ValueError, match=r"'level' belong\(s\) to another kind; kind 'cooking' takes the knobs recipe, take"):
    envs.make("textworld", kind="cooking", level=3)


@pytest.mark.parametrize("knobs,message", [
    ({"go": 5}, r"tw-make rejects --go 5: .*invalid choice: '?5'? \(choose from 1, 6, 9, 12\)"),
    ({"recipe": "two"}, r"tw-make rejects --recipe two: .*invalid int value: 'two'"),
    ({"split": "dev"}, r"invalid choice: '?dev'?"),
    ({"cut": "yes"}, r"knob 'cut' is a switch \(--cut\): give True or False"),
])
def test_knobs_tw_make_rejects_fail_with_its_message(knobs, message):
  """The knobs go through the challenge's own argparse parser: its message, before any game is built.

  Break checked: passing knobs straight to the challenge's make (no parser) fails at build time with
  another message (or builds with go=5 silently).
  """
  with pytest.raises(ValueError, match=message):
    envs.make("textworld", kind="cooking", **knobs)


def test_a_game_that_fails_to_build_names_its_seed_and_tw_makes_message(tmp_path):
  """A level out of tw-make's range fails on the first game, naming its seed, the tw-make command and
  the generator's own message; nothing is left in the folder that claims to be a game.

  Break checked: swallowing build errors (build_game returning (seed, None)) fails the raise, and the
  pool then fails later on a missing game.
  """
  with pytest.raises(tw_pool.GameBuildError,
                     match=r"game 0 failed to build \(`tw-make tw-coin_collector --level 301 --seed 0`\): "
                           r"ValueError: Expected level to be within \[1-300\]"):
    envs.make("textworld", kind="coin_collector", level=301, games=2, eval_games=1, data_dir=str(tmp_path))
  (folder,) = tmp_path.iterdir()
  assert not [p for p in os.listdir(folder) if p.endswith((".z8", ".sha256"))]


def test_build_failures_of_some_games_keep_the_others(copied, monkeypatch):
  """When some games fail, the error names the first failed seed and its message, and says the others
  stay cached: they are, and the next load builds only the failed one.

  Break checked: raising at the first failure without finishing the others loses the games after it
  (game 2 would be missing in the second load's build list).
  """
  data_dir, folder, spec, built = copied
  for s in (0, 1, 2):
    os.remove(tw_pool.game_paths(folder, s)[2])
  spy = tw_pool.build_game

  def flaky(kind, settings, seed, where):
    return (seed, "RuntimeError: inform7 crashed") if seed == 1 else spy(kind, settings, seed, where)

  monkeypatch.setattr(tw_pool, "build_game", flaky)
  with pytest.raises(tw_pool.GameBuildError, match=r"1 of 3 games failed to build; game 1 .*--seed 1`\): "
                                                   r"RuntimeError: inform7 crashed\. The 2 built games stay cached"):
    tw_pool.load_pool(spec, data_dir, workers=1)
  assert built == [0, 2]
  monkeypatch.setattr(tw_pool, "build_game", spy)
  tw_pool.load_pool(spec, data_dir, workers=1)
  assert built == [0, 2, 1]


def test_a_missing_textworld_package_names_the_pip_line(monkeypatch):
  """Break checked: importing textworld at module level (or without the pip line) fails the message."""
  real_import = builtins.__import__

  def no_textworld(name, *args, **kwargs):
    if name == "textworld" or name.startswith("textworld."):
      raise ImportError("No module named 'textworld'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_textworld)
  with pytest.raises(ImportError, match=r'pip install -e "\.\[benchmarks\]"'):
    envs.make("textworld", kind="coin_collector")


def test_the_config_names_the_bad_env_field():
  """A config with a knob of another kind fails validation naming the field, before any compute.

  Break checked: config._validate_env naming the first knob whose name is in the message (`cook`, in
  "cooking") rather than the quoted one fails the field.
  """
  from configs import textworld as tw_config
  from mtrl_jax import config
  c = tw_config.get_config("kind=cooking,runlocal=true")
  c.env.kwargs.level = 4
  with pytest.raises(ValueError, match=r"config.env.kwargs.level: .*'level' belong"):
    config.validate(c)


def test_the_parallel_builders_build_what_one_process_builds(cached_coin, tmp_path):
  """Builder processes (workers=2) build games with the same walkthroughs and scores as the cached
  pool's for the same tw-make seeds, each recorded under its own seed.

  Break checked: the builder threads sending every job the first seed of their list (the other
  games never built) fails the load ("missing right after building it").
  """
  spec = tw_pool.PoolSpec.of("coin_collector", TINY["coin_collector"][0], 2, 1)
  tw_pool.forget_pools()
  par = tw_pool.load_pool(spec, str(tmp_path), workers=2)
  key = lambda rec: (rec["seed"], rec["walkthrough"], rec["max_score"])
  cached = [key(cached_coin.records[p]) for p in cached_coin.train[:2] + cached_coin.eval[:1]]
  assert [key(par.records[p]) for p in par.train + par.eval] == cached
  assert len({tuple(k[1]) for k in cached}) >= 2  # different games: the comparison has teeth
