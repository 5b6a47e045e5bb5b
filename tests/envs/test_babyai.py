"""The `babyai` env (minigrid's BabyAI levels in words): the renderer on hand-built views, the
bot expert on pools of each level the docs use, determinism across processes, disjoint train
and eval tasks, invalid replies, truncation and the bad inputs' errors."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from mtrl_jax import envs
from env_test_utils import run_episode

pytest.importorskip("minigrid")
from minigrid.core.grid import Grid  # noqa: E402
from minigrid.core.world_object import Ball, Door, Key, Wall  # noqa: E402

from mtrl_jax.envs import babyai_text  # noqa: E402
from mtrl_jax.envs.babyai import ACTIONS, _plan  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The levels docs/tasks.md measures (configs/babyai.py's LEVELS and the SmolLM2 setting).
USED = ("GoToLocalS6N2", "OpenDoor", "UnlockLocal", "GoToObj", "GoToRedBall")


# -- the renderer -----------------------------------------------------------------------------


def _hand_built_env():
  """A GoToRedBall env whose grid is replaced by hand: an 8 x 8 walled room, the agent at
  (3, 3) facing east (+x), a red ball at (5, 4), a locked grey door at (4, 1), holding a blue key.
  Facing east, ahead is +x and the agent's right is +y (minigrid's y grows downwards)."""
  env = envs.make("babyai", level="GoToRedBall")
  env.reset(0)
  mg = env._mg
  grid = Grid(8, 8)
  grid.wall_rect(0, 0, 8, 8)
  grid.set(5, 4, Ball("red"))
  grid.set(4, 1, Door("grey", is_locked=True))
  mg.grid, mg.agent_pos, mg.agent_dir, mg.carrying = grid, (3, 3), 0, Key("blue")
  env._image = mg.gen_obs()["image"]
  return env


def test_renderer_on_a_hand_built_grid():
  """Object, colour, door state and position relative to the agent, walls, what it carries, as
  read from a real minigrid view. Breaks checked: left and right swapped (the ball at "l1", the
  door at "r2"), ahead counted from the view's far edge (the ball at "f4"), the door's state
  dropped, the carried key listed as an object "f0"."""
  env = _hand_built_env()
  assert env.view().items == (babyai_text.Item("grey", "door", "locked", 1, -2),
                              babyai_text.Item("red", "ball", "", 2, 1))
  assert babyai_text.terse(env.view()) == "wall f4 l3\ngrey door f1 l2 locked\nred ball f2 r1\ncarry blue key"
  assert babyai_text.natural(env.view()) == (
      "You see a locked grey door 1 step ahead and 2 steps to the left, a red ball 2 steps ahead "
      "and 1 step to the right. There is a wall 4 steps ahead, a wall 3 steps to your left. "
      "You carry a blue key.")
  # Turning right (to face south, +y): the ball is now ahead-left (1 ahead, 2 to the left).
  env._mg.agent_dir = 1
  env._image = env._mg.gen_obs()["image"]
  assert "red ball f1 l2" in babyai_text.terse(env.view())


def test_renderer_on_a_hand_built_array():
  """read_view on an array written cell by cell (no minigrid): a purple box straight ahead, an
  open green door beside the agent on its right, a wall 2 steps to its left; unseen cells (0)
  and empty ones (1) say nothing. Break checked: the side walls looked for one row ahead of the
  agent's own (the wall line is lost)."""
  image = np.zeros((7, 7, 3), np.uint8)
  image[:, 3:, 0] = 1                      # the near rows seen and empty
  image[3, 3] = (7, 3, 0)                  # purple box: column 3 (centre), row 3 -> 3 ahead
  image[4, 6] = (4, 1, 0)                  # open green door: right of the agent, its own row
  image[1, 6] = (2, 5, 0)                  # wall 2 to the left
  image[3, 6] = (1, 0, 0)                  # the agent's cell: empty (it carries nothing)
  view = babyai_text.read_view(image)
  assert babyai_text.terse(view) == "wall l2\ngreen door f0 r1 open\npurple box f3"
  assert babyai_text.natural(view, invalid=True).endswith("You carry nothing. That reply was not an action.")
  with pytest.raises(ValueError, match="shape"):
    babyai_text.read_view(np.zeros((6, 6, 3)))


def test_terse_bound_holds_for_the_fullest_view():
  """TERSE_MAX_CHARS bounds a terse observation: the longest objects (locked purple doors) on
  the 8 far cells with two-digit positions ("f6 l3"), walls on the three lines, a carried purple
  ball and the invalid mark reach it exactly; a view full of doors (more objects than the cap)
  and pools of the used levels stay under it. Break checked: the object cap raised past
  TERSE_MAX_OBJECTS (the full view then runs past the bound)."""
  image = np.ones((7, 7, 3), np.uint8)     # seen, empty
  for i in (0, 1, 2, 4, 5, 6):
    image[i, 0] = (4, 3, 2)                # locked purple doors 6 ahead, 1-3 to either side
  image[0, 1] = image[6, 1] = (4, 3, 2)    # and 5 ahead, 3 to either side
  image[3, 0] = image[0, 6] = image[6, 6] = (2, 5, 0)   # walls at 6 ahead, 3 left, 3 right
  image[3, 6] = (6, 3, 0)                  # carrying a purple ball
  text = babyai_text.terse(babyai_text.read_view(image), invalid=True)
  assert len(text) == babyai_text.TERSE_MAX_CHARS
  full = np.zeros((7, 7, 3), np.uint8)
  full[:, :] = (4, 3, 2)
  assert len(babyai_text.terse(babyai_text.read_view(full), invalid=True)) <= babyai_text.TERSE_MAX_CHARS
  for level in USED:
    env = envs.make("babyai", level=level)
    for seed in range(5):
      transcript, _ = run_episode(env, seed, "expert", quality=0.5)
      assert max(len(t[1]) for t in transcript) <= babyai_text.TERSE_MAX_CHARS  # t[1]: the observation


@pytest.mark.parametrize("style", ["terse", "natural"])
def test_action_words_do_what_they_say(style):
  """On the hand-built room: left and right turn the agent, forward steps ahead, pickup takes the
  object in front, drop puts it back there, toggle opens the closed door in front, done changes
  nothing. Break checked: ACTIONS out of minigrid's order (pickup and drop swapped: the expert
  still wins, its words are consistently wrong, but "pickup" drops)."""
  env = _hand_built_env()
  mg = env._mg
  mg.carrying = None
  mg.grid.set(4, 3, Ball("green"))         # in front of the agent (east of (3, 3))
  mg.grid.set(3, 2, Door("red"))           # north of it: a closed door
  env.style = style
  env.step("left")
  assert mg.agent_dir == 3 and tuple(mg.agent_pos) == (3, 3)   # facing north now
  env.step("toggle")
  assert mg.grid.get(3, 2).is_open
  env.step("right")
  assert mg.agent_dir == 0
  env.step("pickup")
  assert mg.carrying is not None and mg.carrying.color == "green" and mg.grid.get(4, 3) is None
  env.step("drop")
  assert mg.carrying is None and mg.grid.get(4, 3).type == "ball"
  env.step("right")
  assert mg.agent_dir == 1
  env.step("forward")
  assert tuple(mg.agent_pos) == (3, 4)
  before = (tuple(mg.agent_pos), mg.agent_dir, mg.grid.encode().tobytes())
  env.step("done")
  assert (tuple(mg.agent_pos), mg.agent_dir, mg.grid.encode().tobytes()) == before


# -- the expert -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", USED)
def test_expert_wins_every_task_of_a_pool(level):
  """The bot wins each of 30 tasks (docs/tasks.md: 500 of 500 on each level used). Break
  checked: the last episode's bot and its suggestion kept across reset (a plan for another
  layout)."""
  env = envs.make("babyai", level=level)
  wins = [run_episode(env, seed, "expert")[1] for seed in range(30)]
  assert all(wins), [s for s, w in enumerate(wins) if not w]


@pytest.mark.parametrize("level", ("GoToRedBall", "OpenDoor", "UnlockLocal", "GoToSeqS5R2"))
def test_expert_replans_after_the_agent_strays(level):
  """Half the actions random (the demos' quality knob at 0.5): the bot, rebuilt from the
  current state after each stray action, still wins nearly all (the bar leaves room for a box
  a random toggle destroys). Break checked: no rebuild after a stray action (the old bot's
  suggestion kept)."""
  env = envs.make("babyai", level=level, max_turns=None if level.startswith("GoToSeq") else 64)
  wins = [run_episode(env, seed, "expert", quality=0.5)[1] for seed in range(30 if level != "GoToSeqS5R2" else 10)]
  assert sum(wins) >= 0.9 * len(wins), wins


def test_a_fresh_bot_plans_only_what_the_mission_still_needs():
  """In a two-part mission (GoToSeq: "a, then b" and "a after b"), once a part is done the
  rebuilt bot's stack holds the other part's subgoals only; with nothing done it holds what the
  bot's own start pushes, in its order. Breaks checked: `_plan` ignoring the verifier's done flags
  (both parts pushed again), "a, then b" pushed with b on top."""
  from minigrid.envs.babyai.core.verifier import AfterInstr, BeforeInstr
  from minigrid.utils.baby_ai_bot import BabyAIBot
  env = envs.make("babyai", level="GoToSeq")
  checked = 0
  for seed in range(40):
    env.reset(seed)
    instr = env._mg.instrs
    if not isinstance(instr, (BeforeInstr, AfterInstr)):
      continue
    first, rest = (instr.instr_a, instr.instr_b) if isinstance(instr, BeforeInstr) else (instr.instr_b, instr.instr_a)
    bot, want = BabyAIBot(env._mg), BabyAIBot(env._mg)
    bot.stack = []
    _plan(bot, instr)
    assert [repr(g) for g in bot.stack] == [repr(g) for g in want.stack]  # nothing done: the bot's own start
    want.stack = []
    want._process_instr(rest)
    # Mark the first part done as the verifier would, then plan.
    setattr(instr, "a_done" if isinstance(instr, BeforeInstr) else "b_done", "success")
    bot.stack = []
    _plan(bot, instr)
    assert [repr(g) for g in bot.stack] == [repr(g) for g in want.stack]
    checked += 1
  assert checked >= 5


# -- determinism, seeds ---------------------------------------------------------------------


def _transcripts(levels, seeds):
  """Per (level, seed): the prompt and each turn's text, reward and flags, under a fixed mix of
  expert and random actions, and the action words the env offers."""
  out = {}
  for level in levels:
    env = envs.make("babyai", level=level)
    for seed in seeds:
      transcript, _ = run_episode(env, seed, "expert", quality=0.6)
      out[f"{level}/{seed}"] = {"transcript": json.loads(json.dumps(transcript)), "actions": list(ACTIONS)}
  return out


def test_same_seed_same_task_in_another_process():
  """A fresh interpreter (another PYTHONHASHSEED) plays the same tasks: equal prompts,
  observations, rewards, flags and action words. Break checked: minigrid reset without our seed
  (`self._mg.reset()`: the layouts differ)."""
  levels, seeds = ("GoToRedBall", "UnlockLocal"), (0, 7, 1_000_003, 2**40 + 5)
  code = ("import json, sys; sys.path.insert(0, 'tests/envs'); from test_babyai import _transcripts; "
          f"print(json.dumps(_transcripts({levels!r}, {seeds!r})))")
  env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == _transcripts(levels, seeds)


def _layout(env, seed):
  env.reset(seed)
  return env.mission, env._mg.grid.encode().tobytes(), tuple(env._mg.agent_pos), env._mg.agent_dir


def test_training_and_evaluation_tasks_are_disjoint():
  """configs/babyai.py's demo seeds, RL task seeds and evaluation seeds are disjoint sets, and
  so are the levels they build (mission, grid, agent's place): a held-out evaluation. Breaks
  checked: eval.seed_offset = 0 in the config (the seed sets meet), the env reducing its seed
  mod 2**16 before minigrid (1,000,000 and 16,960 then build the same level: the training set
  here includes each evaluation seed mod 2**16 to catch exactly that)."""
  sys.path.insert(0, ROOT)
  from configs import babyai as babyai_config
  from mtrl_jax.train.source import task_seeds
  c = babyai_config.get_config("")
  demo = set(range(c.seed, c.seed + c.demos.episodes))
  rl = {s for step in range(c.rl.steps) for s in task_seeds(c.seed, step, c.rl.tasks_per_update)}
  ev = set(range(c.eval.seed_offset, c.eval.seed_offset + max(c.eval.tasks, 64)))
  assert not (demo & ev) and not (rl & ev)
  env = envs.make("babyai", **c.env.kwargs)
  train_layouts = {_layout(env, s) for s in sorted(demo)[:200] + [s % 2**16 for s in sorted(ev)]}
  eval_layouts = {_layout(env, s) for s in sorted(ev)}
  assert not (train_layouts & eval_layouts)


# -- invalid replies, truncation, bad input ---------------------------------------------------


@pytest.mark.parametrize("reply", ["jump", "", "   ", "left forward", "x" * 5000, "pick up", "\x00\n", "lefty"])
def test_invalid_words_are_counted_and_change_nothing(reply):
  """Any reply that is not one action word: invalid_action, turn reward 0, the level untouched
  (same state, same step count, same view plus the "invalid" line), the session goes on and a
  valid word then works. Break checked: unknown words not caught before minigrid (ACTIONS.index
  raises: the session crashes)."""
  env = envs.make("babyai", level="GoToRedBall")
  first = env.reset(3)
  key, steps = env.state_key(), env._mg.step_count
  out = env.step(reply)
  assert out.info["invalid_action"] and out.info["turn_reward"] == 0.0 and out.reward == 0.0
  assert not out.terminated and not out.truncated
  assert out.observation == first.observation + "\ninvalid"
  assert env.state_key() == key and env._mg.step_count == steps and env.turn == 1
  ok = env.step("LEFT ")  # case and spaces forgiven
  assert not ok.info["invalid_action"] and env.state_key() != key


def test_natural_replies_are_read_leniently():
  """The chat model's sentences name one action; two actions or none are invalid. Break checked:
  "pick up" read as no action (pick_option alone finds no action word in it)."""
  env = envs.make("babyai", level="GoToRedBall", style="natural")
  for reply, want in [("I will turn left.", "left"), ("Move forward", "forward"), ("pick up the ball", "pickup"),
                      ("Open the door.", "toggle"), ("drop", "drop"), ("**toggle**", "toggle"),
                      ("left then forward", "left then forward"), ("hmm", "hmm")]:
    assert env.natural_action(reply) == want, reply
  env.reset(0)
  assert env.step("left then forward").info["invalid_action"]
  assert not env.step("Turn right.").info["invalid_action"]


def test_max_turns_truncates_and_invalid_replies_count():
  """max_turns cuts the session (truncated, not terminated, success False) with invalid replies
  counted; by default the level's own step limit is the cut. Break checked: invalid replies not
  counted towards max_turns (the session runs past 3 turns)."""
  env = envs.make("babyai", level="GoToRedBall", max_turns=3)
  env.reset(0)
  outs = [env.step(a) for a in ("left", "nonsense", "left")]
  assert [o.truncated for o in outs] == [False, False, True]
  assert not outs[-1].terminated and outs[-1].info["success"] is False
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("left")
  own = envs.make("babyai", level="OpenRedDoor")
  own.reset(1)
  assert own.max_turns == own._mg.max_steps == 50
  while not own.done:
    out = own.step("left")
  assert out.truncated and own.turn == 50 and not out.info["success"]


def test_success_and_reward_are_minigrids():
  """On success: terminated, success True, the reward minigrid computes (1 - 0.9 * steps /
  limit), the terse text ends "won". Break checked: reward replaced by 1.0."""
  env = envs.make("babyai", level="GoToRedBall")
  transcript, success = run_episode(env, 5)
  steps = env._mg.step_count
  assert success and transcript[-1][2] == pytest.approx(1 - 0.9 * steps / env._mg.max_steps)
  assert transcript[-1][1].endswith("\nwon") and transcript[-1][3]


def test_unknown_level_lists_the_known_ones():
  """Break checked: the name passed to gymnasium unchecked (its error names no BabyAI level)."""
  with pytest.raises(ValueError, match=r"unknown level 'GoToRedBal'.*GoToRedBall.*PickupLoc"):
    envs.make("babyai", level="GoToRedBal")
  assert envs.make("babyai", level="BabyAI-GoToLocal-v0").level == "GoToLocal"


def test_missing_minigrid_names_the_pip_line(monkeypatch):
  """Break checked: a bare `import minigrid` (ModuleNotFoundError without the install line)."""
  monkeypatch.setitem(sys.modules, "minigrid", None)
  with pytest.raises(ImportError, match=r'pip install "minigrid'):
    envs.make("babyai", level="GoToRedBall")


@pytest.mark.parametrize("kwargs,match", [({"style": "chatty"}, "style must be one of"),
                                          ({"max_turns": 0}, "max_turns must be >= 1"),
                                          ({"levle": "GoToObj"}, "did you mean 'level'")])
def test_bad_arguments_name_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    envs.make("babyai", **kwargs)


# -- copies and state keys --------------------------------------------------------------------


def test_clone_and_replay_continue_identically():
  """A clone taken mid-episode (expert's bot alive) and a replay from the action history
  continue as the original does. Break checked: the expert first asked mid-session planning
  from the current state without catching up on the history (the replay's bot has seen nothing
  of the room: it walks another way)."""
  env = envs.make("babyai", level="UnlockLocal")
  rng = random.Random(0)
  env.reset(4)
  for _ in range(5):
    env.step(envs.policy_action(env, "expert", rng, 0.7))
  copies = [env.clone(), env.replay()]
  runs = []
  for e in [env] + copies:
    steps = []
    while not e.done:
      out = e.step(e.expert_action())
      steps.append((out.observation, out.reward, out.terminated, out.truncated))
    runs.append(steps)
  assert runs[0] == runs[1] == runs[2] and runs[0][-1][2]


def test_equal_state_keys_mean_equal_futures():
  """Two moments of a task with equal keys continue with the same observations and the same
  end (the reward's size aside: minigrid's shrinks with the steps taken, which the key leaves
  out, GiGPO's revisited state). Break checked: the key without the grid's digest (a key
  dropped elsewhere: the views differ)."""
  env = envs.make("babyai", level="UnlockLocal", max_turns=40)
  rng = random.Random(2)
  tail = ["forward", "pickup", "right", "forward", "toggle", "drop", "left", "forward"]
  checked = 0
  for seed in range(2):
    histories = {}  # key -> the action histories that reached it (replayed only when shared)
    for _ in range(4):
      env.reset(seed)
      while not env.done:
        histories.setdefault(env.state_key(), []).append(list(env.actions))
        env.step(envs.policy_action(env, "expert", rng, 0.5))
    for key, same in histories.items():
      if len(same) < 2 or checked >= 20:
        continue
      futures = []
      for actions in same[:2]:
        e = env.replay(seed, actions)
        assert e.state_key() == key
        e.max_turns = 10**6
        futures.append([(o.observation, o.terminated) for o in _steps_until_done(e, tail)])
      assert futures[0] == futures[1], key
      checked += 1
  assert checked >= 10, checked
  # Moments the walks rarely pair up: the same place, heading and empty hands, a ball moved.
  here = _hand_built_env()
  here._mg.carrying = None
  here._mg.grid.set(4, 3, Ball("green"))
  moved = here.clone()
  for a in ("pickup", "left", "drop", "right"):  # the ball from in front to the left-hand cell
    moved.step(a)
  assert (tuple(moved._mg.agent_pos), moved._mg.agent_dir) == (tuple(here._mg.agent_pos), here._mg.agent_dir)
  futures = [[o.observation for o in _steps_until_done(e.clone(), ["left", "forward"])] for e in (here, moved)]
  assert futures[0] != futures[1] and here.state_key() != moved.state_key()


def _steps_until_done(env, actions):
  for a in actions:
    if env.done:
      return
    yield env.step(a)
