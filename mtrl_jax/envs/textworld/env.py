"""`textworld`: TextWorld's coin collector, treasure hunter and cooking games behind the `Env` protocol.

  make("textworld", kind="coin_collector", level=10)                  # terse text, 200 + 64 games
  make("textworld", kind="cooking", recipe=2, take=2, go=6, cut=True, style="natural")

Tasks: a task seed picks a game of the pool (pool.py): a held-out seed (in
HELD_OUT_SEEDS, where evaluation and the lab draw) one of the `eval_games`
evaluation games, any other seed one of the `games` training games. The two sets
are built from disjoint tw-make seeds. A game is deterministic: its text,
scores and admissible commands are a function of the task seed and the actions.

A turn: the action is matched against the game's admissible commands (lower
case, spaces collapsed; in the natural style the command a free-text reply names).
An admissible command is played; anything else is not sent to the game (so no
reply can restart, quit or otherwise derail it), counts as `invalid_action`
and leaves the state as it was. Reward: the score's change (divided by the
game's maximum score when `normalize`, so a won game returns 1.0); `success`
is the game's `won`; `terminated` when it is won or lost; `max_turns` truncates.
`info["on_plan"]`: the command was the expert's at the state it was played in (a turn the
walkthrough needs; the credit lab splits its scores by it).

Expert: the first of textworld's `policy_commands` at the current state (its
walkthrough, re-planned by textworld from wherever the agent has strayed; in
cooking, `examine cookbook` first, as the recorded walkthroughs do);
random: a uniform admissible command; suboptimal: a uniform admissible command
other than the expert's. Copies (`clone`) replay the action history on a fresh
game (the interpreter's state lives in C, deterministic under replay).
"""
from __future__ import annotations

import hashlib
import random
import threading

from mtrl_jax.envs.base import Env, EnvError, Reset, Step, check_style
from mtrl_jax.envs.registry import register
from mtrl_jax.envs.textworld import render
from mtrl_jax.envs.textworld.pool import PoolSpec, check_kind, import_textworld, load_pool

# Task seeds evaluation plays (mtrl_jax/train/source.py's HELD_OUT_SEEDS: envs may not import
# train/, tests hold the two equal). A seed in here picks an evaluation game.
HELD_OUT_SEEDS = range(1_000_000, 3_000_000)
DEFAULT_MAX_TURNS = 50
DEFAULT_LEVEL = {"coin_collector": 5, "treasure_hunter": 5}
_NATURAL_HINTS = {
    "coin_collector": "'go north' or 'take coin'",
    "treasure_hunter": "'go east', 'open door' or 'take key'",
    "cooking": "'examine cookbook', 'take knife from table' or 'slice carrot with knife'",
}
_TERSE_PROMPTS = {
    "coin_collector": "coin collector: find the coin and take it. go north|south|east|west, take coin",
    "treasure_hunter": "treasure hunter: {goal}. go <dir>, open/take/unlock <thing>",
    "cooking": "cooking: examine cookbook, take and prepare the ingredients, prepare meal, eat meal",
}
_INVALID_NATURAL = "That is not a command this game accepts here. Nothing happens."

# Started games kept for the next session of the same game (starting one costs 30-100 ms,
# resetting one 10-25 ms): path -> started textworld envs, at most _KEEP a game and _KEEP_ALL in
# all (a started game holds its own copy of the interpreter: ~0.2 MB).
_IDLE: dict[str, list] = {}
_IDLE_LOCK = threading.Lock()
_KEEP, _KEEP_ALL = 8, 256
# textworld is not thread-safe: games loaded at once in two threads break its logic parser (tatsu),
# seen as failed starts with 3 env threads. Every call into textworld holds this lock (a step takes
# 10-50 ms, mostly Python under the GIL anyway).
_TW_LOCK = threading.RLock()


def _start(path: str, infos):
  with _IDLE_LOCK:
    idle = _IDLE.get(path)
    if idle:
      return idle.pop()
  tw = import_textworld()
  with _TW_LOCK:
    return tw.start(path, request_infos=infos)


def _park(path: str, game) -> None:
  with _IDLE_LOCK:
    idle = _IDLE.setdefault(path, [])
    if len(idle) < _KEEP and sum(map(len, _IDLE.values())) < _KEEP_ALL:
      idle.append(game)
      return
  with _TW_LOCK:
    game.close()


@register("textworld")
class TextWorld(Env):
  """One TextWorld game per task seed, from a pool built once per (kind, knobs)."""

  def __init__(self, kind: str = "coin_collector", level: int | None = None,
               recipe: int | None = None, take: int | None = None, go: int | None = None,
               open: bool | None = None, cook: bool | None = None, cut: bool | None = None,
               drop: bool | None = None, recipe_seed: int | None = None, split: str | None = None,
               games: int = 200, eval_games: int = 64, max_turns: int = DEFAULT_MAX_TURNS,
               style: str = "terse", terse_chars: int = render.TERSE_CHARS, normalize: bool = True,
               list_commands: bool = False, data_dir: str = "", workers: int = 0):
    """
    Args:
      kind: coin_collector | treasure_hunter | cooking.
      level .. split: tw-make's options of that kind, one to one (None: tw-make's default;
        coin_collector and treasure_hunter need `level`: 1-300 and 1-30).
      games, eval_games: training and held-out evaluation games in the pool.
      max_turns: turns before truncation (invalid commands count).
      style: terse (compact, bounded, for the byte model) | natural (the game's text).
      terse_chars: the terse style's upper bound on characters per observation.
      normalize: reward = score change / max score (a won game returns 1.0); else the raw change.
      list_commands: natural style: append the admissible commands to each observation.
      data_dir: where pools are cached ("" = $MTRL_TEXTWORLD_DIR or ~/.cache/mtrl_jax/textworld).
      workers: processes building missing games (0 = one per CPU core).
    """
    knobs = dict(level=level, recipe=recipe, take=take, go=go, open=open, cook=cook, cut=cut,
                 drop=drop, recipe_seed=recipe_seed, split=split)
    if kind in DEFAULT_LEVEL and level is None:
      knobs["level"] = DEFAULT_LEVEL[kind]  # tw-make requires --level: a short quest by default
    self.kind = check_kind(kind)
    self.spec = PoolSpec.of(kind, knobs, games, eval_games)
    self.style = check_style("textworld", style)
    if not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"textworld: max_turns must be a positive int, got {max_turns!r}")
    if terse_chars < 80:
      raise ValueError(f"textworld: terse_chars={terse_chars} leaves no room for a room and its "
                       f"exits; use at least 80")
    self.max_turns, self.terse_chars = max_turns, terse_chars
    self.normalize, self.list_commands = normalize, list_commands
    self.pool = load_pool(self.spec, data_dir, workers)
    self._game, self._state = None, None
    self._infos = import_textworld().EnvInfos(
        admissible_commands=True, policy_commands=True, max_score=True, won=True, lost=True,
        score=True, facts=True, objective=True)

  # -- tasks ----------------------------------------------------------------

  def game_path(self, seed: int) -> str:
    """The game a task seed plays: held-out seeds the evaluation games, others the training games."""
    if seed in HELD_OUT_SEEDS:
      return self.pool.eval[(seed - HELD_OUT_SEEDS.start) % len(self.pool.eval)]
    return self.pool.train[seed % len(self.pool.train)]

  def _reset(self, seed: int) -> Reset:
    self._release()
    self.path = self.game_path(seed)
    try:
      self._game = _start(self.path, self._infos)
      with _TW_LOCK:
        state = self._game.reset()
    except Exception as e:  # noqa: BLE001  (an interpreter failure is the env's, not the agent's)
      self._game = None
      raise EnvError(f"textworld: game {self.path} failed to start: {e!r}") from e
    self._state, self._read_recipe = state, False
    self.score = int(state["score"] or 0)
    self.max_score = max(int(state["max_score"] or 1), 1)
    self._natural = render.natural(state["feedback"])
    return Reset(self._terse_prompt(state), self._terse(state["feedback"]))

  def _step(self, action: str) -> Step:
    cmd = render.normalize(action)
    admissible = set(self._state["admissible_commands"])
    if cmd not in admissible:
      self._natural = _INVALID_NATURAL
      obs = render.terse(render.Facts(self._state["facts"]), "invalid command", self.terse_chars)
      return Step(obs, 0.0, False, False, {"invalid_action": True, "score": self.score, "on_plan": False})
    on_plan = cmd == self.expert_action()  # the walkthrough's command at this state (the lab reads it)
    try:
      with _TW_LOCK:
        state, score, done = self._game.step(cmd)
    except Exception as e:  # noqa: BLE001
      raise EnvError(f"textworld: game {self.path} crashed on {cmd!r}: {e!r}") from e
    self._read_recipe = self._read_recipe or cmd == "examine cookbook"
    score = int(score or 0)
    delta, self.score, self._state = score - self.score, score, state
    reward = delta / self.max_score if self.normalize else float(delta)
    info = {"invalid_action": False, "score": score, "on_plan": on_plan}
    if done:
      info["success"] = bool(state["won"])
      self._release()
    self._natural = render.natural(state["feedback"])
    return Step(self._terse(state["feedback"]), reward, bool(done), False, info)

  def _release(self) -> None:
    if self._game is not None:
      _park(self.path, self._game)
      self._game = None

  def __del__(self):
    try:
      self._release()
    except Exception:  # noqa: BLE001  (interpreter shutdown)
      pass

  # -- views ------------------------------------------------------------------

  def _terse(self, feedback: str) -> str:
    return render.terse(render.Facts(self._state["facts"]), feedback, self.terse_chars)

  def _terse_prompt(self, state) -> str:
    goal = ""
    if self.kind == "treasure_hunter":
      plan = state["policy_commands"] or ["take the object"]
      goal = f"find and {plan[-1]}"
    return _TERSE_PROMPTS[self.kind].format(goal=goal)

  def natural_prompt(self) -> str:
    extra = " The commands you can use are listed after each observation." if self.list_commands else ""
    return ("You are playing a text adventure game. Read what the game says and reply with one "
            f"command per turn, such as {_NATURAL_HINTS[self.kind]}.{extra}")

  def natural_observation(self, terse: str, step: Step | None) -> str:
    del terse, step
    text = self._natural
    if self.list_commands and self._state is not None and not self.done_game():
      text += "\n\nCommands: " + " | ".join(self._state["admissible_commands"])
    return text

  def done_game(self) -> bool:
    return bool(self._state["won"] or self._state["lost"])

  def natural_action(self, reply: str) -> str:
    return render.pick_command(reply, self._state["admissible_commands"])

  # -- policies ---------------------------------------------------------------

  def expert_action(self) -> str:
    # Cooking: read the recipe first, as the recorded walkthrough does (textworld's plan skips it,
    # knowing the recipe; an agent learns from the demos to look it up).
    if (self.kind == "cooking" and not self._read_recipe
        and "examine cookbook" in self._state["admissible_commands"]):
      return "examine cookbook"
    plan = self.plan()
    return plan[0] if plan else "look"  # a lost game has no plan: mark time

  def plan(self) -> list[str]:
    """textworld's shortest winning command sequence from the current state."""
    return list(self._state["policy_commands"] or [])

  def admissible(self) -> list[str]:
    return list(self._state["admissible_commands"])

  def random_action(self, rng: random.Random) -> str:
    return rng.choice(self.admissible())

  def suboptimal_action(self, rng: random.Random) -> str:
    others = [c for c in self.admissible() if c != self.expert_action()]
    return rng.choice(others or self.admissible())

  def walkthrough(self) -> list[str]:
    """The recorded walkthrough of the current game (from the pool's build)."""
    return list(self.pool.records[self.path]["walkthrough"])

  def state_key(self) -> str | None:
    """A digest of the game's logical facts (the whole world state) and its score."""
    if getattr(self, "_state", None) is None:
      return None
    facts = sorted(str(f) for f in self._state["_facts"])
    return hashlib.blake2b(repr((self.path, self.score, facts)).encode(), digest_size=8).hexdigest()

  # -- copies -----------------------------------------------------------------

  def clone(self) -> Env:
    """A copy at the same state, by replaying the action history on a fresh game."""
    return self.replay()

  def __deepcopy__(self, memo):
    return self.replay() if hasattr(self, "seed") else self.fresh()
