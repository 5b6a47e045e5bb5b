"""`textarena`: TextArena's offline single-player games behind the `Env` protocol.

  make("textarena", game="FrozenLake-v0")                 # compact text, raw rewards
  make("textarena", game="Sokoban-v0", success_only=True) # 1.0 on a win, else 0.0

Observations: TextArena's prompts and boards are long, so `compact=True`
(default) renders the four games a tiny model is meant to learn straight from
their state (FrozenLake "P...\\n...H\\n....\\n.HHG", Sokoban without its wall
ring, TowerOfHanoi "A:321 B: C:", GuessTheNumber "higher"), and any other game
through a generic filter that drops the boilerplate. `compact=False` passes
TextArena's text through.

Actions: bracketed as TextArena wants; a bare action (`up`, `A C`, `7`) is
bracketed for you. The random policy uses per-game action sets for the named
games and, for any other game, the `[...]` tokens seen in its prompt and
observations. Scripted experts: FrozenLake (BFS), Sokoban (BFS over
player + boxes), TowerOfHanoi (recursive), GuessTheNumber (binary search).

TextArena draws from the *global* `random` (and some games from numpy's
global RNG). The adapter gives each env its own copy of both states and swaps
it in, under one process-wide lock, around every TextArena call: episodes are
deterministic under the seed and independent across host threads (TextArena
calls are serialised, they take well under a millisecond).

Not supported offline: word games (Wordle, Hangman, SpellingBee, ...) that
download NLTK data at runtime, games that call a remote LLM (TwentyQuestions,
GuessWho), and multi-player games.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import random
import re
import threading

import numpy as np

from mtrl_jax.envs.base import Env, EnvError, Reset, Step
from mtrl_jax.envs.registry import register

# Offline single-player games checked to reset and step with the random policy
# (textarena 0.7.4); their variants (-hard, -5x5, ...) work as well.
OFFLINE_GAMES = (
    "2048-v0", "Bandit-v0", "Blackjack-v0", "Countdown-v0", "Crosswords-v0",
    "Cryptarithm-v0", "FifteenPuzzle-v0", "FrozenLake-v0", "GuessTheNumber-v0",
    "LightsOut-v0", "LogicPuzzle-v0", "Mastermind-v0", "Minesweeper-v0", "PegJump-v0",
    "RushHour-v0", "Secretary-v0", "Set-v0", "Slitherlink-v0", "Sokoban-v0", "Sudoku-v0",
    "ThreeCardMonte-v0", "TowerOfHanoi-v0",
)
EXPERT_GAMES = ("FrozenLake", "Sokoban", "TowerOfHanoi", "GuessTheNumber")
DEFAULT_MAX_TURNS = 100
_FALLBACK_ACTIONS = ("[up]", "[down]", "[left]", "[right]", "[0]", "[1]", "[2]", "[3]",
                     "[yes]", "[no]")
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,16}\]")
_INVALID = re.compile(r"You attempted an invalid move\. Reason: (.*?)(?: Please resubmit.*)?$",
                      re.S)
_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

_TA_LOCK = threading.RLock()


def _import_textarena():
  try:
    import textarena
  except ImportError as e:
    raise ImportError('the textarena env needs TextArena: pip install -e ".[textarena]"') from e
  return textarena


def _messages(raw) -> list[tuple[str, str]]:
  """TextArena observations as (type name, text); tolerant of field order."""
  out = []
  for item in raw:
    text = next((x for x in item if isinstance(x, str)), "")
    kind = next((x.name for x in item if hasattr(x, "name") and hasattr(x, "value")), "")
    out.append((kind, text))
  return out


@register("textarena")
class TextArena(Env):
  """One TextArena single-player game as a text env."""

  def __init__(self, game: str = "FrozenLake-v0", success_only: bool = False,
               compact: bool = True, max_turns: int | None = None,
               game_kwargs: dict | None = None):
    """
    Args:
      game: a TextArena env id (see OFFLINE_GAMES).
      success_only: reward 1.0 for a win and 0.0 otherwise, instead of
        TextArena's final reward (which pays partial progress).
      compact: short observations and prompt for tiny models.
      max_turns: horizon (invalid moves count); default: the game's own turn
        limit, else 100.
      game_kwargs: keyword arguments for the TextArena env (e.g. {"size": 5}).
    """
    ta = _import_textarena()
    from textarena.envs.registration import ENV_REGISTRY
    if game not in ENV_REGISTRY:
      raise ValueError(f"unknown TextArena game {game!r}; offline single-player games: "
                       f"{', '.join(OFFLINE_GAMES)}")
    self.game = game
    self.success_only, self.compact = success_only, compact
    try:
      env = ta.make(game + "-raw" if game + "-raw" in ENV_REGISTRY else game,
                    **(game_kwargs or {}))
    except LookupError as e:
      raise RuntimeError(_nltk_message(game)) from e
    while isinstance(env, ta.Wrapper):  # drop TextArena's LLM-prompt wrappers
      env = env.env
    self._ta = env
    self.kind = type(env).__name__.removesuffix("Env")  # "FrozenLake", "Sokoban", ...
    game_limit = getattr(env, "max_turns", None)
    self.max_turns = max_turns or (game_limit if isinstance(game_limit, int) else DEFAULT_MAX_TURNS)
    self._rng_states = None

  # -- the global-RNG sandbox ---------------------------------------------

  @contextlib.contextmanager
  def _own_rng(self, seed: int | None = None):
    with _TA_LOCK:
      saved = random.getstate(), np.random.get_state()
      try:
        if seed is not None:
          random.seed(seed)
          np.random.seed(seed % 2**32)
        elif self._rng_states is not None:
          random.setstate(self._rng_states[0])
          np.random.set_state(self._rng_states[1])
        yield
      finally:
        self._rng_states = random.getstate(), np.random.get_state()
        random.setstate(saved[0])
        np.random.set_state(saved[1])

  # -- episode --------------------------------------------------------------

  def _reset(self, seed: int) -> Reset:
    with self._own_rng(seed):
      try:
        self._ta.reset(num_players=1, seed=seed)
      except LookupError as e:
        raise RuntimeError(_nltk_message(self.game)) from e
      except (AssertionError, ValueError) as e:
        raise ValueError(f"TextArena game {self.game!r} is not a single-player game: {e}") from e
      except Exception as e:  # e.g. a puzzle generator giving up on this seed
        raise EnvError(f"TextArena {self.game!r} failed to reset (seed {seed}): {e!r}") from e
      _, raw = self._ta.get_observation()
    if type(self._ta.state).__name__ != "SinglePlayerState":
      raise ValueError(f"TextArena game {self.game!r} is not a single-player game")
    msgs = _messages(raw)
    full_prompt = "\n".join(t for k, t in msgs if k == "PROMPT").strip()
    self._tokens: list[str] = []
    self._harvest(msgs)
    self._sokoban_plan = {}  # the Sokoban expert's plan (state -> move), per episode
    self._sokoban_stuck = False  # a detour left no solution: the expert only marks time
    prompt = _COMPACT_PROMPTS.get(self.kind, full_prompt) if self.compact else full_prompt
    return Reset(prompt, self._observe(msgs, invalid=False, ended=None))

  def _step(self, action: str) -> Step:
    a = action.strip()
    if "[" not in a:
      a = f"[{a}]"
    with self._own_rng():
      try:
        done, _ = self._ta.step(action=a)
        _, raw = self._ta.get_observation()
        closed = self._ta.close() if done else None
      except Exception as e:  # a game's own bug must not kill the actor thread
        raise EnvError(f"TextArena {self.game!r} crashed on {a!r}: {e!r}") from e
    msgs = _messages(raw)
    self._harvest(msgs)
    invalid = any(k == "GAME_ADMIN" and _INVALID.match(t) for k, t in msgs)
    if not done:
      return Step(self._observe(msgs, invalid, None), 0.0, False, False,
                  {"invalid_action": invalid})
    rewards, game_info = closed
    final = rewards.get(0, 0.0) if rewards else 0.0
    info0 = game_info.get(0, {}) if game_info else {}
    reason = info0.get("reason", "")
    if isinstance(final, str):  # some games pass set_invalid_move(reward, reason) swapped
      final, reason = reason, final
    final = _as_float(final)
    reason = str(reason)
    invalid = invalid or bool(info0.get("invalid_move", False))
    success = final >= 1.0 and not info0.get("invalid_move", False)
    truncated = bool(re.search(r"(turn|move) limit", reason, re.I)) and not success
    info = {"invalid_action": invalid, "success": success, "reason": reason,
            "game_reward": final}
    reward = float(success) if self.success_only else final
    obs = self._observe(msgs, invalid, "won" if success else "time up" if truncated else "lost")
    if not self.compact and reason:
      obs = f"{obs}\n{reason}".strip()
    return Step(obs, reward, not truncated, truncated, info)

  def clone(self) -> Env:
    try:
      return copy.deepcopy(self)
    except Exception:  # a game holding something uncopyable: rebuild from history
      return self.replay()

  def state_key(self) -> str | None:
    """The game's state for the games whose state is small (the board of the task
    is fixed by the seed): FrozenLake's square, Sokoban's player and boxes, the
    Hanoi towers, the guesses so far, each with TextArena's count of invalid
    moves in a row (one more ends the game); None for the other games."""
    if self.kind == "FrozenLake":
      key = str(tuple(self._ta.state.game_state["player_pos"]))
    elif self.kind == "Sokoban":
      boxes = sorted(tuple(int(x) for x in p) for p in np.argwhere((self._ta.room_state == 3)
                                                                   | (self._ta.room_state == 4)))
      key = f"{tuple(int(x) for x in self._ta.player_position)}:{boxes}"
    elif self.kind == "TowerOfHanoi":
      key = str(sorted((k, tuple(v)) for k, v in self._ta.state.game_state["towers"].items()))
    elif self.kind == "GuessTheNumber":
      key = str(self._ta.state.game_state["guess_history"])
    else:
      return None
    return f"{key}:e{getattr(self._ta.state, 'error_count', 0)}"

  # -- observations ---------------------------------------------------------

  def _harvest(self, msgs) -> None:
    """Collects the bracketed action tokens a game mentions (random policy)."""
    for kind, text in msgs:
      if kind != "PLAYER_ACTION":
        for tok in _BRACKETED.findall(text):
          if tok not in self._tokens:
            self._tokens.append(tok)

  def _observe(self, msgs, invalid: bool, ended: str | None) -> str:
    if not self.compact:
      return "\n".join(t for k, t in msgs if k not in ("PROMPT", "PLAYER_ACTION")).strip()
    render = getattr(self, f"_render_{self.kind}", None)
    text = render() if render else _generic_render(msgs)
    notes = [n for n in ("invalid" if invalid else "", ended or "") if n]
    return "\n".join([text] + notes) if text else " ".join(notes)

  def _render_FrozenLake(self) -> str:
    gs = self._ta.state.game_state
    grid = [["." if c == " " else c for c in row] for row in gs["grid"]]
    r, c = gs["player_pos"]
    grid[r][c] = "P"
    return "\n".join("".join(row) for row in grid)

  def _render_Sokoban(self) -> str:
    room = self._ta.room_state
    fixed = self._ta.room_fixed
    chars = {0: "#", 1: ".", 2: "O", 3: "*", 4: "X", 5: "P", 6: "P"}
    rows = ["".join("p" if v == 5 and f == 2 else chars[int(v)] for v, f in zip(row, frow))
            for row, frow in zip(room, fixed)]
    if all(ch == "#" for ch in rows[0] + rows[-1] + "".join(r[0] + r[-1] for r in rows)):
      rows = [r[1:-1] for r in rows[1:-1]]  # the wall ring carries no information
    return "\n".join(rows)

  def _render_TowerOfHanoi(self) -> str:
    towers = self._ta.state.game_state["towers"]
    sep = "" if self._ta.num_disks < 10 else ","
    return " ".join(f"{t}:{sep.join(map(str, d))}" for t, d in towers.items())

  def _render_GuessTheNumber(self) -> str:
    hist = self._ta.state.game_state["guess_history"]
    if not hist:
      return f"guess {self._ta.min_number}-{self._ta.max_number}"
    return hist[-1][1]  # "higher" / "lower"

  # -- policies -------------------------------------------------------------

  def random_action(self, rng: random.Random) -> str:
    if self.kind in ("FrozenLake", "Sokoban"):
      return rng.choice(("[up]", "[down]", "[left]", "[right]"))
    if self.kind == "TowerOfHanoi":
      return rng.choice(("[A B]", "[A C]", "[B A]", "[B C]", "[C A]", "[C B]"))
    if self.kind == "GuessTheNumber":
      return f"[{rng.randint(self._ta.min_number, self._ta.max_number)}]"
    buttons = getattr(self._ta, "buttons", None)  # e.g. Bandit
    tokens = self._tokens + ([f"[{b}]" for b in buttons] if isinstance(buttons, list) else [])
    return _fill(rng.choice(tokens or _FALLBACK_ACTIONS), rng)

  def expert_action(self) -> str:
    expert = getattr(self, f"_expert_{self.kind}", None)
    if expert is None:
      raise NotImplementedError(f"no scripted expert for TextArena game {self.game!r}; "
                                f"experts exist for {', '.join(EXPERT_GAMES)}")
    return expert()

  def _expert_FrozenLake(self) -> str:
    gs = self._ta.state.game_state
    grid, size = gs["grid"], len(gs["grid"])
    free = lambda p: 0 <= p[0] < size and 0 <= p[1] < size and grid[p[0]][p[1]] != "H"
    step = lambda p, d: (p[0] + d[0], p[1] + d[1]) if free((p[0] + d[0], p[1] + d[1])) else None
    path = _bfs_path(tuple(gs["player_pos"]), lambda p: p == tuple(gs["goal_pos"]), step)
    return f"[{path[0][1]}]" if path else "[down]"

  def _expert_Sokoban(self) -> str:
    room, fixed = self._ta.room_state, self._ta.room_fixed
    walls = {tuple(p) for p in np.argwhere(room == 0)}
    targets = frozenset(tuple(p) for p in np.argwhere(fixed == 2))
    boxes = frozenset(tuple(p) for p in np.argwhere((room == 3) | (room == 4)))
    player = tuple(int(x) for x in self._ta.player_position)

    def succ(state, d):
      (pr, pc), bx = state
      nxt = (pr + d[0], pc + d[1])
      if nxt in walls or not (0 <= nxt[0] < room.shape[0] and 0 <= nxt[1] < room.shape[1]):
        return None
      if nxt in bx:
        beyond = (nxt[0] + d[0], nxt[1] + d[1])
        if (beyond in walls or beyond in bx
            or not (0 <= beyond[0] < room.shape[0] and 0 <= beyond[1] < room.shape[1])):
          return None
        return nxt, (bx - {nxt}) | {beyond}
      return nxt, bx

    state = (player, boxes)
    plan = self._sokoban_plan
    if self._sokoban_stuck:
      return "[up]"
    if state not in plan:  # plan once per episode (or after a detour), then look up
      path = _bfs_path(state, lambda s: s[1] <= targets, succ, limit=300_000)
      if path is None and self.turn > 0:
        # A detour (a low-quality demo's random move) can push a box into a corner: the
        # episode is lost, and searching again every turn would cost 300k states each.
        self._sokoban_stuck = True
        return "[up]"
      if path is None:
        raise NotImplementedError(f"Sokoban expert: breadth-first search found no solution "
                                  f"within 300k states ({self.game}); it handles small "
                                  f"boards such as Sokoban-v0 (6x6, 3 boxes)")
      plan = self._sokoban_plan = dict(path)
    return f"[{plan[state]}]" if state in plan else "[up]"

  def _expert_TowerOfHanoi(self) -> str:
    towers = self._ta.state.game_state["towers"]
    where = {disk: peg for peg, disks in towers.items() for disk in disks}

    def next_move(n: int, target: str):
      """The first move of the optimal plan putting disks 1..n on `target`."""
      if n == 0:
        return None
      src = where[n]
      if src == target:
        return next_move(n - 1, target)
      other = ({"A", "B", "C"} - {src, target}).pop()
      return next_move(n - 1, other) or (src, target)

    move = next_move(self._ta.num_disks, "C")
    return f"[{move[0]} {move[1]}]" if move else "[A C]"

  def _expert_GuessTheNumber(self) -> str:
    lo, hi = self._ta.min_number, self._ta.max_number
    for guess, hint in self._ta.state.game_state["guess_history"]:
      if hint == "higher":
        lo = max(lo, guess + 1)
      else:
        hi = min(hi, guess - 1)
    return f"[{(lo + hi) // 2}]"


def _bfs_path(start, is_goal, succ, limit: int = 100_000):
  """Breadth-first search; [(state, move), ...] along a shortest path to a goal
  (empty if start is one), or None if there is none within `limit` states."""
  parents = {start: None}
  queue = collections.deque([start])
  while queue and len(parents) <= limit:
    cur = queue.popleft()
    if is_goal(cur):
      path = []
      while parents[cur] is not None:
        cur, move = parents[cur]
        path.append((cur, move))
      return path[::-1]
    for name, d in _MOVES.items():
      nxt = succ(cur, d)
      if nxt is not None and nxt not in parents:
        parents[nxt] = (cur, name)
        queue.append(nxt)
  return None


_PLACEHOLDERS = {"row", "col", "column", "number", "r", "c", "n", "i", "j", "k", "x", "y"}


def _fill(token: str, rng: random.Random) -> str:
  """Re-draws the numbers and placeholders of an example token: "[3 2]" -> "[7 0]".

  Prompts show one example move ("[3 2]", "[row col]"); redrawing its digits
  turns it into a uniform-ish draw over the game's moves, bad ones included.
  """
  parts = re.split(r"([^\w]+)", token[1:-1])
  out = [str(rng.randint(0, 9)) if p.isdigit() or p.lower() in _PLACEHOLDERS else p
         for p in parts]
  return "[" + "".join(out) + "]"


def _as_float(x) -> float:
  try:
    return float(x)
  except (TypeError, ValueError):
    try:  # e.g. "Invalid Move: 0.25"
      return float(str(x).rsplit(" ", 1)[-1])
    except ValueError:
      return 0.0


def _generic_render(msgs) -> str:
  """Any game's observation minus TextArena's boilerplate."""
  lines = []
  for kind, text in msgs:
    if kind in ("PROMPT", "PLAYER_ACTION"):
      continue
    m = _INVALID.match(text.strip())
    if m:
      lines.append(f"invalid: {m.group(1).strip()}")
      continue
    for line in text.splitlines():
      s = line.rstrip()
      if re.match(r"\s*(Current Board|Game Board|Current Sudoku Grid)\s*:?\s*$", s):
        continue
      if re.match(r"\s*(Available (Actions|Moves)|Valid moves)\s*:", s):
        continue
      lines.append(s)
  text = "\n".join(lines)
  return re.sub(r"\n\s*\n+", "\n", text).strip()


def _nltk_message(game: str) -> str:
  return (f"TextArena game {game!r} needs NLTK word lists that it downloads at runtime: "
          f"not supported offline. Offline single-player games: {', '.join(OFFLINE_GAMES)}")


_COMPACT_PROMPTS = {
    "FrozenLake": "frozenlake: walk P to G, avoid holes H. [up] [down] [left] [right]",
    "Sokoban": "sokoban: push boxes X onto goals O (* done, p you on O). [up] [down] [left] [right]",
    "TowerOfHanoi": "hanoi: move all disks to C, small on big. [A C] moves A's top to C",
    "GuessTheNumber": "guess the number: [n]; hints higher/lower",
}
