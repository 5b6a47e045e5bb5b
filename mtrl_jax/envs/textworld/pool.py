"""The game pool: TextWorld games built once by textworld's own generator, cached by content hash.

  pool = load_pool(PoolSpec.of("coin_collector", {"level": 10}, games=200, eval_games=64),
                   data_dir="")
  pool.train[0], pool.eval[0]        # paths of .z8 games (each with its .json beside it)

A pool is the kind and its tw-make knobs (parsed by the challenge's own argparse
parser, so a knob tw-make rejects is rejected here with tw-make's words) and two
disjoint sets of tw-make seeds: training games are seeds 0..games-1, held-out
evaluation games seeds EVAL_GAME_SEED0.. (no training game is ever an evaluation
game). Each game is built by the challenge's `make` and `compile_game`, exactly
as `tw-make <challenge> <knobs> --seed N` does.

Cache: `<data_dir>/<kind>-<knobs>-<digest>/g<seed>.{z8,json,sha256}`; the digest
hashes the kind, the parsed knobs and the textworld version, so two knob sets
never share a folder and a textworld upgrade builds afresh. The `.sha256`
sidecar is written last, after both files are in place, and holds their
hashes: a game whose sidecar is missing or whose files do not match it (a
crash mid-write, a truncated copy) is rebuilt, never trusted. Building is
parallel (a process pool, `workers`), with a progress bar; a game that fails
to build is reported with its seed and tw-make's message, and every game built
before it stays cached.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
from typing import Any, Sequence

from mtrl_jax.metrics import Progress, say

# Our kind names -> textworld's challenge names (`tw-make <challenge>`).
CHALLENGES = {"coin_collector": "tw-coin_collector", "treasure_hunter": "tw-treasure_hunter",
              "cooking": "tw-cooking"}
# Every knob of every kind, named as tw-make's options are (--recipe-seed -> recipe_seed); the
# env's constructor takes exactly these (tests check they are the challenges' own options).
KNOBS = {"coin_collector": ("level",), "treasure_hunter": ("level",),
         "cooking": ("recipe", "take", "go", "open", "cook", "cut", "drop", "recipe_seed", "split")}
ALL_KNOBS = tuple(dict.fromkeys(k for ks in KNOBS.values() for k in ks))
# Evaluation games are tw-make seeds EVAL_GAME_SEED0 + j; training games 0 .. games - 1 < this.
EVAL_GAME_SEED0 = 1_000_000
POOL_FORMAT = 1  # bump when what a pool folder holds changes
PIP_LINE = 'pip install -e ".[benchmarks]"  (or: pip install "textworld>=1.7")'


class GameBuildError(RuntimeError):
  """A game could not be built: names the tw-make command (kind, knobs, seed) and its message."""


def import_textworld():
  """textworld, or an ImportError naming the pip line that installs it."""
  try:
    import textworld
    import textworld.challenges  # noqa: F401  (registers the challenges)
    import textworld.generator  # noqa: F401
  except ImportError as e:
    raise ImportError(f"the textworld env needs the textworld package: {PIP_LINE}") from e
  _quiet_jericho()
  return textworld


def _quiet_jericho() -> None:
  """Jericho warns on every game it has no bindings for (every generated game): say nothing."""
  import warnings
  try:
    from jericho.jericho import UnsupportedGameWarning
  except ImportError:  # another interpreter backend: nothing to silence
    return
  warnings.filterwarnings("ignore", category=UnsupportedGameWarning)


def default_data_dir() -> str:
  """$MTRL_TEXTWORLD_DIR, else the user cache folder ($XDG_CACHE_HOME or ~/.cache)/mtrl_jax/textworld."""
  if os.environ.get("MTRL_TEXTWORLD_DIR"):
    return os.environ["MTRL_TEXTWORLD_DIR"]
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "mtrl_jax", "textworld")


def _challenge_parser(kind: str) -> argparse.ArgumentParser:
  tw = import_textworld()
  _, _, add_arguments = tw.challenges.CHALLENGES[CHALLENGES[kind]]
  parser = argparse.ArgumentParser(prog=f"tw-make {CHALLENGES[kind]}", add_help=False)
  add_arguments(parser)
  return parser


def challenge_options(kind: str) -> tuple[str, ...]:
  """The option names (argparse dests) tw-make's parser of this kind declares."""
  return tuple(a.dest for a in _challenge_parser(kind)._actions if a.dest != "help")


def check_kind(kind: str) -> str:
  if kind not in CHALLENGES:
    raise ValueError(f"textworld: unknown kind {kind!r}; kinds: {', '.join(CHALLENGES)}")
  return kind


def parse_knobs(kind: str, knobs: dict[str, Any]) -> dict[str, Any]:
  """The settings tw-make would build with: `knobs` (None = tw-make's default) parsed by the
  challenge's own parser. A knob of another kind, a value its parser refuses (a type, a
  choice, a missing required option) raises ValueError with tw-make's message."""
  check_kind(kind)
  given = {k: v for k, v in knobs.items() if v is not None}
  foreign = [k for k in given if k not in KNOBS[kind]]
  if foreign:
    raise ValueError(f"textworld: {', '.join(map(repr, foreign))} belong(s) to another kind; kind "
                     f"{kind!r} takes the knobs {', '.join(KNOBS[kind])}")
  parser = _challenge_parser(kind)
  flags = {a.dest: a for a in parser._actions if a.dest != "help"}
  argv = []
  for k, v in given.items():
    flag = flags[k].option_strings[-1]
    if isinstance(flags[k], argparse._StoreTrueAction):
      if not isinstance(v, bool):
        raise ValueError(f"textworld kind {kind!r}: knob {k!r} is a switch ({flag}): give True or "
                         f"False, got {v!r}")
      argv += [flag] if v else []
    else:
      argv += [flag, str(v)]
  err = io.StringIO()
  try:
    with contextlib.redirect_stderr(err):
      ns = parser.parse_args(argv)
  except SystemExit:
    msg = err.getvalue().strip().splitlines()
    raise ValueError(f"textworld kind {kind!r}: tw-make rejects {' '.join(argv) or '(no knobs)'}: "
                     f"{msg[-1] if msg else 'bad arguments'}") from None
  return {k: getattr(ns, k) for k in KNOBS[kind]}


def tw_make_line(kind: str, settings: dict, seed: int) -> str:
  """The tw-make command that builds the same game (for messages and docs)."""
  parts = [f"tw-make {CHALLENGES[kind]}"]
  for k, v in settings.items():
    flag = "--" + k.replace("_", "-")
    if v is True:
      parts.append(flag)
    elif v is not None and v is not False:
      parts.append(f"{flag} {v}")
  return " ".join(parts + [f"--seed {seed}"])


@dataclasses.dataclass(frozen=True)
class PoolSpec:
  """What a pool is: the kind, its parsed tw-make settings, and how many games of each split."""
  kind: str
  settings: tuple[tuple[str, Any], ...]
  games: int
  eval_games: int

  @classmethod
  def of(cls, kind: str, knobs: dict[str, Any], games: int, eval_games: int) -> "PoolSpec":
    for name, n in (("games", games), ("eval_games", eval_games)):
      if not isinstance(n, int) or n < 1:
        raise ValueError(f"textworld: {name} must be a positive int, got {n!r}")
    if games > EVAL_GAME_SEED0:
      raise ValueError(f"textworld: games={games} would reach the evaluation games' seeds "
                       f"({EVAL_GAME_SEED0}..); use at most {EVAL_GAME_SEED0}")
    return cls(kind, tuple(sorted(parse_knobs(kind, knobs).items())), games, eval_games)

  def train_seeds(self) -> list[int]:
    return list(range(self.games))

  def eval_seeds(self) -> list[int]:
    return [EVAL_GAME_SEED0 + j for j in range(self.eval_games)]

  def folder_name(self) -> str:
    tw = import_textworld()
    content = json.dumps({"kind": self.kind, "settings": self.settings, "textworld": tw.__version__,
                          "format": POOL_FORMAT}, sort_keys=True)
    digest = hashlib.sha1(content.encode()).hexdigest()[:10]
    readable = "-".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in self.settings
                        if v not in (None, False))
    return f"{self.kind}-{readable}-{digest}" if readable else f"{self.kind}-{digest}"


@dataclasses.dataclass(frozen=True)
class Pool:
  """A built, verified pool: game paths (.z8) by split, and each game's sidecar record."""
  spec: PoolSpec
  folder: str
  train: tuple[str, ...]
  eval: tuple[str, ...]
  records: dict  # path -> sidecar dict (hashes, walkthrough, max_score)

  def walkthrough_lengths(self, split: str = "train") -> list[int]:
    return [len(self.records[p]["walkthrough"]) for p in getattr(self, split)]


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def game_paths(folder: str, seed: int) -> tuple[str, str, str]:
  base = os.path.join(folder, f"g{seed}")
  return base + ".z8", base + ".json", base + ".sha256"


def check_game(folder: str, seed: int) -> tuple[str, dict | None]:
  """('ok', record) for a game whose files match its sidecar; ('missing', None) when it was
  never finished; ('corrupt', None) when a file does not match its recorded hash."""
  z8, js, side = game_paths(folder, seed)
  if not os.path.exists(side):
    return "missing", None
  try:
    with open(side) as f:
      rec = json.load(f)
    if _sha256(z8) == rec["z8"] and _sha256(js) == rec["json"]:
      return "ok", rec
  except (OSError, ValueError, KeyError, TypeError):
    pass
  return "corrupt", None


def build_game(kind: str, settings: dict, seed: int, folder: str) -> tuple[int, str | None]:
  """Builds one game into `folder` (as `tw-make` would); returns (seed, None) or (seed, error).

  Writes in a private temporary folder, moves the two files into place, then writes the
  sidecar last: a crash at any point leaves a game without a valid sidecar (rebuilt later).
  Runs in worker processes: it returns errors rather than raising them through the pool.
  """
  tw = import_textworld()
  from textworld.generator import compile_game
  os.makedirs(folder, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=folder, prefix=f".build-g{seed}-")
  try:
    opts = tw.GameOptions()
    opts.seeds = seed
    opts.path = os.path.join(tmp, "game.z8")
    opts.file_ext = ".z8"
    opts.force_recompile = True
    _, make, _ = tw.challenges.CHALLENGES[CHALLENGES[kind]]
    with contextlib.redirect_stdout(io.StringIO()):
      game = make(settings=dict(settings), options=opts)
      path = compile_game(game, opts)
    built_js = os.path.splitext(path)[0] + ".json"
    walkthrough = list(game.metadata.get("walkthrough") or [])
    rec = {"z8": _sha256(path), "json": _sha256(built_js), "seed": seed, "kind": kind,
           "walkthrough": walkthrough, "max_score": int(game.max_score),
           "textworld": tw.__version__, "tw_make": tw_make_line(kind, settings, seed)}
    z8, js, side = game_paths(folder, seed)
    if os.path.exists(side):
      os.remove(side)  # a stale sidecar must not vouch for the files replaced below
    os.replace(path, z8)
    os.replace(built_js, js)
    with open(os.path.join(tmp, "sidecar"), "w") as f:
      json.dump(rec, f)
    os.replace(os.path.join(tmp, "sidecar"), side)
    return seed, None
  except Exception as e:  # noqa: BLE001  (reported with the seed; the pool raises GameBuildError)
    msg = " ".join(str(e).split()) or type(e).__name__
    return seed, f"{type(e).__name__}: {msg}"
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _worker() -> None:
  """A builder process: reads `kind settings-json seed folder` jobs (one JSON list a line) from
  stdin and answers each with `[seed, error-or-null]` on stdout."""
  for line in sys.stdin:
    kind, settings, seed, folder = json.loads(line)
    with contextlib.redirect_stdout(sys.stderr):  # textworld's chatter must not reach the answers
      out = build_game(kind, settings, seed, folder)
    sys.stdout.write(json.dumps(list(out)) + "\n")
    sys.stdout.flush()


def _package_root() -> str:
  import mtrl_jax
  return os.path.dirname(os.path.dirname(os.path.abspath(mtrl_jax.__file__)))


def _build_parallel(kind: str, settings: dict, seeds: Sequence[int], folder: str, workers: int, on_done):
  """Builds `seeds` on `workers` builder processes (each a fresh interpreter: nothing is forked
  from a process that may hold JAX's threads, and no caller's __main__ is re-run); calls
  on_done(seed, error) as each finishes."""
  import queue
  import subprocess
  jobs: "queue.Queue[int]" = queue.Queue()
  for s in seeds:
    jobs.put(s)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([_package_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  lock = threading.Lock()

  def run():
    proc = subprocess.Popen([sys.executable, "-c", "from mtrl_jax.envs.textworld.pool import _worker; _worker()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    try:
      while True:
        try:
          seed = jobs.get_nowait()
        except queue.Empty:
          return
        proc.stdin.write(json.dumps([kind, settings, seed, folder]) + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        try:
          got, err = json.loads(answer)
        except ValueError:
          got, err = seed, f"the builder process died (exit code {proc.poll()})"
        with lock:
          on_done(got, err)
        if proc.poll() is not None:
          return
    finally:
      if proc.stdin:
        proc.stdin.close()
      proc.wait()

  threads = [threading.Thread(target=run, daemon=True) for _ in range(workers)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  left = []
  while not jobs.empty():
    left.append(jobs.get_nowait())
  for s in left:  # every builder died before taking them
    on_done(s, "no builder process was left to build it")


def _build_all(kind: str, settings: dict, seeds: Sequence[int], folder: str, workers: int) -> None:
  """Builds `seeds` in parallel with a progress bar; raises GameBuildError naming the first
  failure (the games built before and beside it stay cached)."""
  if not seeds:
    return
  bar = Progress(f"textworld pool {os.path.basename(folder)}", len(seeds))
  # The first game in this process: a knob tw-make's generator rejects (a level out of range)
  # fails here once, before any builder process starts.
  first_err = build_game(kind, settings, seeds[0], folder)[1]
  if first_err:
    raise GameBuildError(f"textworld: game {seeds[0]} failed to build "
                         f"(`{tw_make_line(kind, settings, seeds[0])}`): {first_err}")
  bar.update(1)
  failures: list[tuple[int, str]] = []
  done = [1]

  def on_done(seed, err):
    if err:
      failures.append((seed, err))
    done[0] += 1
    bar.update(done[0], failed=len(failures))

  rest = list(seeds[1:])
  workers = max(1, min(workers, len(rest)))
  if rest and workers == 1:
    for seed in rest:
      on_done(*build_game(kind, settings, seed, folder))
  elif rest:
    _build_parallel(kind, settings, rest, folder, workers, on_done)
  if failures:
    seed, err = sorted(failures)[0]
    raise GameBuildError(f"textworld: {len(failures)} of {len(seeds)} games failed to build; game "
                         f"{seed} (`{tw_make_line(kind, settings, seed)}`): {err}. The "
                         f"{len(seeds) - len(failures)} built games stay cached in {folder}")


_POOLS: dict[tuple, Pool] = {}
_POOLS_LOCK = threading.Lock()


def load_pool(spec: PoolSpec, data_dir: str = "", workers: int = 0) -> Pool:
  """The pool of `spec`, built where missing or corrupt, verified once per process."""
  data_dir = os.path.expanduser(data_dir or default_data_dir())
  folder = os.path.join(data_dir, spec.folder_name())
  key = (folder, spec)
  with _POOLS_LOCK:  # actor threads may ask at once; the first builds, the others wait
    if key in _POOLS:
      return _POOLS[key]
    os.makedirs(folder, exist_ok=True)
    with _folder_lock(folder):  # so do other processes (two runs, two test workers)
      pool = _check_and_build(spec, folder, workers)
    _POOLS[key] = pool
    return pool


@contextlib.contextmanager
def _folder_lock(folder: str):
  """An exclusive lock on a pool folder across processes (released when the holder exits)."""
  import fcntl
  with open(os.path.join(folder, ".lock"), "w") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      say(f"textworld: another process is building {folder}: waiting for it")
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _check_and_build(spec: PoolSpec, folder: str, workers: int) -> Pool:
  """Checks every game of `spec` in `folder` against its sidecar, builds the missing and corrupt ones."""
  settings = dict(spec.settings)
  seeds = spec.train_seeds() + spec.eval_seeds()
  todo, corrupt = [], []
  for s in seeds:
    status, _ = check_game(folder, s)
    if status != "ok":
      todo.append(s)
      if status == "corrupt":
        corrupt.append(s)
  if corrupt:
    say(f"textworld: {len(corrupt)} cached game(s) in {folder} do not match their recorded hashes "
        f"(seeds {corrupt[:5]}{' ...' if len(corrupt) > 5 else ''}): rebuilding them")
  if todo:
    say(f"textworld: building {len(todo)} {spec.kind} game(s) into {folder}")
    _build_all(spec.kind, settings, todo, folder, workers or os.cpu_count() or 1)
  records = {}
  for s in seeds:
    status, rec = check_game(folder, s)
    if status != "ok":  # e.g. another process replaced it mid-way: say so rather than guess
      raise GameBuildError(f"textworld: game {s} in {folder} is {status} right after building it")
    records[game_paths(folder, s)[0]] = rec
  paths = lambda ss: tuple(game_paths(folder, s)[0] for s in ss)
  return Pool(spec, folder, paths(spec.train_seeds()), paths(spec.eval_seeds()), records)


def forget_pools() -> None:
  """Drops the in-process record of verified pools (tests: the next load re-checks the files)."""
  with _POOLS_LOCK:
    _POOLS.clear()


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m mtrl_jax.envs.textworld --kind coin_collector --level 10 --games 300`:
  builds (or checks) a pool and prints its size, walkthrough lengths and the time taken."""
  import time
  ap = argparse.ArgumentParser(description=main.__doc__)
  ap.add_argument("--kind", required=True, choices=sorted(CHALLENGES))
  for k in ALL_KNOBS:
    ap.add_argument("--" + k.replace("_", "-"), dest=k, default=None,
                    type=(lambda s: s.lower() in ("1", "true", "yes")) if k in ("open", "cook", "cut", "drop")
                    else (str if k == "split" else int))
  ap.add_argument("--games", type=int, default=200)
  ap.add_argument("--eval_games", type=int, default=64)
  ap.add_argument("--data_dir", default="")
  ap.add_argument("--workers", type=int, default=0)
  a = ap.parse_args(argv)
  knobs = {k: getattr(a, k) for k in KNOBS[a.kind]}
  spec = PoolSpec.of(a.kind, knobs, a.games, a.eval_games)
  t0, c0 = time.time(), os.times()
  pool = load_pool(spec, a.data_dir, a.workers)
  c1 = os.times()
  cpu = (c1.user + c1.system + c1.children_user + c1.children_system
         - c0.user - c0.system - c0.children_user - c0.children_system)
  lengths = pool.walkthrough_lengths("train")
  print(json.dumps({"folder": pool.folder, "train": len(pool.train), "eval": len(pool.eval),
                    "wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu, 1),
                    "walkthrough_min": min(lengths), "walkthrough_mean": round(sum(lengths) / len(lengths), 2),
                    "walkthrough_max": max(lengths),
                    "max_score": sorted({r["max_score"] for r in pool.records.values()})}))

