"""`babyai`: minigrid's BabyAI levels behind the `Env` protocol, in words.

  make("babyai", level="GoToRedBall")                   # terse text for the byte model
  make("babyai", level="PickupLoc", style="natural")    # sentences for a chat model

The task is the level's mission ("go to the red ball", "pick up the blue key in front of
you"), in the prompt; each observation is the agent's partial view (7 x 7 cells in front
of it) rendered by envs/babyai_text.py: the objects it sees with colour, kind and position
relative to it, the nearest walls, what it carries. Actions are minigrid's, as words:
left, right (turn), forward, pickup, drop, toggle (open a door or box), done. Any other
reply is counted as `invalid_action`, changes nothing in the level (its step counter does
not move either) and takes one of the session's `max_turns`.

Reward and success are minigrid's: on completing the mission the episode ends with reward
1 - 0.9 * (steps taken / the level's step limit), success True; a mission failed (e.g. the
wrong door opened in a strict level) ends it with 0; the level's own step limit and
`max_turns` truncate. The task is a function of the seed: reset(seed) calls minigrid's
reset(seed=seed), so the same seed gives the same level in any process.

Expert: minigrid's BabyAIBot (minigrid/utils/baby_ai_bot.py). Once started, the bot sees
every step: when the agent took its suggestion it plans on (its own advising mode); when the
agent strayed, a fresh bot plans from the current state for the part of the mission not yet
done, remembering the cells the old one had seen. It starts on the first `expert_action`
call; a call mid-session first replays the session's history on a twin of the level with
the bot running from turn 0, so the expert's advice is a function of the seed and the
actions so far, whenever it is first asked (a clone, a replay, a demo: the same advice). RL
sessions, which never ask, never pay for it. Where the bot cannot plan (a box opened that
the mission needed) the expert says `done`.

Levels are named as minigrid registers them without the `BabyAI-` prefix and `-v0`
suffix: GoToRedBall, GoToLocal, PickupLoc, Open, Unlock, Synth, ... (`LEVELS` lists all).
"""
from __future__ import annotations

import hashlib
import logging
import random
import re

from mtrl_jax.envs import babyai_text
from mtrl_jax.envs.base import Env, Reset, Step, check_style, pick_option
from mtrl_jax.envs.registry import register

ACTIONS = ("left", "right", "forward", "pickup", "drop", "toggle", "done")  # minigrid's order
PIP_LINE = 'pip install "minigrid>=3.0"'
_SYNONYMS = ((re.compile(r"\bpick(s|ed|ing)?\s+(it\s+|them\s+|\w+\s+\w+\s+)?up\b|\bpick\b|\bgrab|\btake\b"), "pickup"),
             (re.compile(r"\b(open|unlock|close)"), "toggle"),
             (re.compile(r"\b(put\s+down|release)\b"), "drop"))


def _import_minigrid():
  try:
    import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
    import gymnasium
    from minigrid.envs.babyai.core import roomgrid_level
  except ImportError as e:
    raise ImportError(f"the babyai env needs minigrid (and gymnasium): {PIP_LINE}") from e
  # A level's generator print()s each layout it rejects and redraws ("Sampling rejected:
  # unreachable object"), several per reset on some levels: routine, not news. A module
  # global shadows the builtin for that module alone (swapping sys.stdout would swallow
  # other threads' output); the lines go to the debug log.
  roomgrid_level.print = _debug_print
  return gymnasium


def _debug_print(*args, **kwargs) -> None:
  del kwargs
  logging.debug("minigrid: %s", " ".join(map(str, args)))


def level_names() -> list[str]:
  """Every BabyAI level minigrid registers, by our short name (needs minigrid)."""
  gym = _import_minigrid()
  return sorted(_short(k) for k in gym.registry if k.startswith("BabyAI-"))


def _short(gym_id: str) -> str:
  return gym_id.removeprefix("BabyAI-").removesuffix("-v0")


def _gym_id(level: str) -> str | None:
  gym = _import_minigrid()
  for cand in (level, f"BabyAI-{level}", f"BabyAI-{level}-v0"):
    if cand.startswith("BabyAI-") and cand in gym.registry:
      return cand
  return None


@register("babyai")
class BabyAI(Env):
  """One BabyAI level; the seed picks the layout and the mission."""

  def __init__(self, level: str = "GoToRedBall", max_turns: int | None = None, style: str = "terse"):
    """
    Args:
      level: a BabyAI level name (GoToRedBall, GoToLocal, PickupLoc, Open, ...; see
        `level_names()`), or minigrid's id (BabyAI-GoToRedBall-v0).
      max_turns: the session's turn limit (invalid replies count); default: the level's
        own step limit (64 for a one-room level, 576 for Open's nine rooms).
      style: 'terse' (the byte model's compact lines, at most
        babyai_text.TERSE_MAX_CHARS characters an observation) or 'natural' (sentences).
    """
    gym = _import_minigrid()
    gym_id = _gym_id(str(level))
    if gym_id is None:
      raise ValueError(f"babyai: unknown level {level!r}; known levels: {', '.join(level_names())}")
    if max_turns is not None and max_turns < 1:
      raise ValueError(f"babyai: max_turns must be >= 1 or None, got {max_turns}")
    self.level = _short(gym_id)
    self.style = check_style("babyai", style)
    self._own_max_turns = max_turns
    self.max_turns = max_turns or 0  # the level's own limit is known after reset
    from gymnasium.envs.registration import load_env_creator
    spec = gym.spec(gym_id)
    self._mg = load_env_creator(spec.entry_point)(**spec.kwargs)

  # -- episode --------------------------------------------------------------

  def _reset(self, seed: int) -> Reset:
    obs, _ = self._mg.reset(seed=seed)
    self._image = obs["image"]
    self.mission = str(self._mg.mission)
    if self._own_max_turns is None:
      self.max_turns = int(self._mg.max_steps)
    self._bot = None          # the expert, started on first use (RL sessions never pay for it)
    self._bot_action = None   # its suggestion at the current state (None: it gave up)
    prompt = f"babyai: {self.mission}. " + " ".join(ACTIONS)
    return Reset(prompt, babyai_text.terse(self.view()))

  def view(self) -> babyai_text.View:
    """What the agent sees now (see envs/babyai_text.py)."""
    return babyai_text.read_view(self._image)

  def _step(self, action: str) -> Step:
    word = action.strip().lower()
    if word not in ACTIONS:
      return Step(babyai_text.terse(self.view(), invalid=True), 0.0, False, False,
                  {"invalid_action": True})
    code = ACTIONS.index(word)
    followed = code == self._bot_action
    obs, reward, terminated, truncated, _ = self._mg.step(code)
    self._image = obs["image"]
    success = bool(terminated and reward > 0)
    if self._bot is not None and not (terminated or truncated):
      if followed:
        self._follow(code)
      else:
        self._start_bot(self._bot.vis_mask)
    info = {"invalid_action": False}
    if terminated or truncated:
      info["success"] = success
    text = babyai_text.terse(self.view())
    if terminated:
      text += "\n" + ("won" if success else "failed")
    return Step(text, float(reward), bool(terminated), bool(truncated), info)

  def state_key(self) -> str:
    """Where the agent stands and faces, what it carries, and a digest of the grid (doors,
    objects moved) and of the mission's progress; no step count (a state revisited is the same
    state, though minigrid's reward for finishing from it shrinks with the steps taken)."""
    mg = self._mg
    grid = hashlib.blake2b(mg.grid.encode().tobytes(), digest_size=6).hexdigest()
    held = f"{mg.carrying.color} {mg.carrying.type}" if mg.carrying else "-"
    return f"{mg.agent_pos[0]},{mg.agent_pos[1]},{mg.agent_dir}:{held}:{grid}:{_progress(mg.instrs)}"

  # -- style='natural' ------------------------------------------------------

  def natural_prompt(self) -> str:
    return (f"You are an agent in a grid world of rooms. Your mission: {self.mission}. Each turn you "
            "are told what you see in front of you (up to 6 steps ahead and 3 to each side; walls "
            "block the view), with each object's colour, kind and position relative to you. Reply "
            "with exactly one action: left (turn left), right (turn right), forward (one step ahead), "
            "pickup (pick up the object in front of you), drop (put down what you carry), toggle "
            "(open or close the door or box in front of you), done. To go to an object, end up "
            "facing it from the next cell.")

  def natural_observation(self, terse: str, step) -> str:
    invalid = step is not None and step.info.get("invalid_action", False)
    text = babyai_text.natural(self.view(), invalid=invalid)
    if step is not None and step.terminated:
      return text + (" Mission complete!" if step.info.get("success") else " The mission failed.")
    return text + " Your action?"

  def natural_action(self, reply: str) -> str:
    found = pick_option(reply, ACTIONS)
    if found:
      return found
    low = reply.lower()
    hits = {name for pattern, name in _SYNONYMS if pattern.search(low)}
    if not hits:  # "turn left", "move forward" name one action word among others
      hits = {a for a in ACTIONS if re.search(rf"\b{a}\b", low)}
    return hits.pop() if len(hits) == 1 else reply.strip()

  # -- policies -------------------------------------------------------------

  def random_action(self, rng: random.Random) -> str:
    return rng.choice(ACTIONS)

  def expert_action(self) -> str:
    if self._bot is None:
      self._catch_up()
    return "done" if self._bot_action is None else ACTIONS[int(self._bot_action)]

  def _catch_up(self) -> None:
    """Starts the bot as if it had run since turn 0 (see the module doc)."""
    if not self.actions:
      self._start_bot(None)
      return
    twin = self.fresh()
    twin.reset(self.seed, self.session)
    twin._start_bot(None)
    for a in self.actions:
      twin.step(a)
    same = (tuple(twin._mg.agent_pos) == tuple(self._mg.agent_pos) and twin._mg.agent_dir == self._mg.agent_dir
            and twin._mg.step_count == self._mg.step_count)
    if not same:  # a level that draws randomness while stepping: plan from here instead
      self._start_bot(None)
      return
    # The twin's level is this one's (same seed, same actions); adopt it with the bot that knows it.
    self._mg, self._image, self._bot, self._bot_action = twin._mg, twin._image, twin._bot, twin._bot_action

  def _start_bot(self, seen) -> None:
    """A bot planning from the current state for what the mission still needs, knowing the
    cells `seen` (a boolean grid; None: what it sees now)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot
    bot = BabyAIBot(self._mg)
    bot.stack = []
    _plan(bot, self._mg.instrs)
    if seen is not None:
      bot.vis_mask |= seen
    self._bot = bot
    try:
      self._bot_action = bot.replan()
    except Exception:  # noqa: BLE001
      if seen is not None:
        # An object it remembers behind a door since closed (a stray toggle): its search
        # does not pass closed doors and asserts. Knowing only the current view it explores.
        self._start_bot(None)
      else:  # it gives up (a box the mission needed was opened): mark time
        self._bot_action = None

  def _follow(self, code: int) -> None:
    """After the agent took the bot's suggestion `code`: its next one (its advising mode)."""
    try:
      self._bot_action = self._bot.replan(code)
    except Exception:  # noqa: BLE001  a plan the step broke: plan afresh
      self._start_bot(self._bot.vis_mask)


def _plan(bot, instr) -> None:
  """Pushes onto `bot`'s stack the subgoals of the parts of `instr` not yet done (the bot's
  own `_process_instr` pushes all of them, right only at the start of an episode)."""
  from minigrid.envs.babyai.core.verifier import AfterInstr, AndInstr, BeforeInstr
  if isinstance(instr, BeforeInstr):      # a, then b: a on top of the stack
    _plan(bot, instr.instr_b)
    if instr.a_done != "success":
      _plan(bot, instr.instr_a)
  elif isinstance(instr, AfterInstr):     # a after b: b on top
    _plan(bot, instr.instr_a)
    if instr.b_done != "success":
      _plan(bot, instr.instr_b)
  elif isinstance(instr, AndInstr):
    if instr.b_done != "success":
      _plan(bot, instr.instr_b)
    if instr.a_done != "success":
      _plan(bot, instr.instr_a)
  else:
    bot._process_instr(instr)


def _progress(instr) -> str:
  """Which parts of a compound mission are done ('' for a single instruction)."""
  if hasattr(instr, "a_done"):
    mark = lambda d: "1" if d == "success" else "0"
    return _progress(instr.instr_a) + mark(instr.a_done) + _progress(instr.instr_b) + mark(instr.b_done)
  return ""


__all__ = ["ACTIONS", "BabyAI", "level_names"]
