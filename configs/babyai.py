"""BabyAI levels (minigrid) in words: the byte model from scratch, or SmolLM2-135M-Instruct.

  python -m mtrl_jax.main --config=configs/babyai.py --workdir=/tmp/babyai_gotoredball
  python -m mtrl_jax.main --config=configs/babyai.py:level=OpenDoor --workdir=...
  python -m mtrl_jax.main --config=configs/babyai.py:model=smol,level=GoToObj --workdir=...
  python -m mtrl_jax.main --config=configs/babyai.py:runlocal=true --workdir=...   (every stage, minutes on a CPU)

model=byte: the tiny byte-level decoder, warm-started by behaviour cloning on the BabyAI bot's
demos (a share `quality` of its actions, the rest random), then RL (MS-GRPO by default) on the
terse rendering (envs/babyai_text.py, at most 239 characters an observation). Every turn of a
session stays in the sampler's cache, so `context_cap` must hold a whole session: the level's
`max_turns` are chosen from the bot's turn counts (docs/tasks.md) and the cap from them.
model=smol: configs/smol.py's pretrained policy (its chat template, pretrained learning rates) on
the natural rendering (sentences).
Args: level, max_turns (0: LEVELS' value, else 32), quality, model (byte | smol), hf_dir,
estimator (ms_grpo | grpo | gae ...; gae adds a critic), context (history | markov: what the
turn layout trains on; history = the session layout), rollout (lockstep | continuous | async |
tree: how RL plays its sessions), seed, runlocal.
Measured: docs/tasks.md (BabyAI section).
"""
from configs import smol
from configs.common import shrink
from mtrl_jax.config import base_config, env_kwargs_for
from mtrl_jax.config_args import parse_args

MODELS = ("byte", "smol")
# How the RL stage plays its sessions (a sweep's grid key: `--grid 'rollout=lockstep,continuous,async,tree'`).
ROLLOUTS = ("lockstep", "continuous", "async", "tree")
# Per level: (max_turns, byte-model context_cap). Turns: about three times the bot's mean walk and
# above its longest at the demos' quality 0.7 (50 seeds: GoToLocalS6N2 mean 4.7 / max 12, OpenDoor
# 10.8 / 30, UnlockLocal 21.5 / 42; at quality 1 on 500 seeds the longest: 8, 16, 26, GoToObj 13). Every turn of a session stays in
# the sampler's cache, so the cap holds max_turns turns of the level's longest terse view plus the
# action (~50-60 bytes a turn on these levels; ~150 on the eight-object rooms, GoToRedBall and
# GoToLocal: those cost three times as much per turn on the CPU).
LEVELS = {"GoToLocalS6N2": (16, 1024), "GoToObj": (16, 1024), "OpenDoor": (20, 1024),
          "UnlockLocal": (32, 2048), "GoToRedBall": (24, 2048), "GoToLocal": (24, 2048),
          "PickupLoc": (24, 2048)}


def get_config(arg=None):
  a = parse_args(arg, {"level": "GoToLocalS6N2", "max_turns": 0, "quality": 0.7, "model": "byte",
                       "hf_dir": "", "estimator": "ms_grpo", "context": "history", "rollout": "lockstep",
                       "seed": 0, "runlocal": False})
  if a["model"] not in MODELS:
    raise ValueError(f"model={a['model']!r}: choose one of {MODELS}")
  if a["hf_dir"] and a["model"] != "smol":
    raise ValueError(f"hf_dir={a['hf_dir']!r}: only model=smol reads a pretrained folder")
  if a["rollout"] not in ROLLOUTS:
    raise ValueError(f"rollout={a['rollout']!r}: choose one of {ROLLOUTS}")
  turns, cap = LEVELS.get(a["level"], (32, 2048))
  turns = a["max_turns"] or turns
  c = base_config()
  c.seed = a["seed"]
  c.env.name = "babyai"
  c.env.kwargs = env_kwargs_for("babyai", level=a["level"], max_turns=turns,
                                style="natural" if a["model"] == "smol" else "terse")
  c.rl.estimator = a["estimator"]
  c.critic.kind = "separate" if a["estimator"] in smol.CRITIC_ESTIMATORS else "none"
  c.value_pretrain.enabled = c.critic.kind != "none"
  if a["context"] != "history":
    c.rl.layout, c.rl.context = "turn", a["context"]

  # Sized for a shared 2-core CPU (docs/tasks.md: ~1-2 h a level there at load ~15).
  c.demos.episodes = 500
  c.demos.quality = a["quality"]
  c.rollout.turn_budget = 8     # the longest action word is 7 bytes
  c.rollout.context_cap = cap
  c.rollout.temperature = 1.0
  c.sft.steps = 300
  c.sft.batch_size = 8
  c.sft.pack = True  # demos run 100-2,000 bytes: one per padded row wasted ~70% (runlocal)
  c.rl.pack = True
  c.rl.steps = 40
  c.rl.lr = 5e-4
  c.rl.tasks_per_update = 4
  c.rl.group_size = 8
  c.eval.every = 20
  c.eval.tasks = 64
  c.eval.greedy = False
  c.checkpoint.every = 10
  c.log.tensorboard = False
  if a["rollout"] == "continuous":  # rows refilled as sessions end (rollout/continuous.py)
    c.rollout.continuous = True
  elif a["rollout"] == "async":  # actors play while the learner trains (rollout/actors.py)
    c.asynchronous.enabled = True
  elif a["rollout"] == "tree":  # every session forks in two at turn 1 (rollout/tree.py)
    c.rollout.tree.update(enabled=True, branch_turns=(1,), width=2)
  if a["model"] == "smol":
    # SmolLM2-135M in full (30 blocks) costs ~1,000x the byte model per token: on a shared 2-core
    # CPU only a few updates fit (docs/tasks.md says what was run and measured).
    smol.use_pretrained(c, a["hf_dir"] or smol.DEFAULT_HF_DIR)
    c.demos.episodes = 64
    c.sft.steps = 16
    c.sft.batch_size = 4
    c.rl.steps = 8
    c.rl.group_size = 4
    c.rl.tasks_per_update = 4
    c.rollout.turn_budget = 8  # one-word replies; longer ones are cut
    # The natural prompt is ~170 tokens, a turn ~50 on a level with few objects in view (GoToObj,
    # OpenDoor); an eight-object room (GoToRedBall, GoToLocal) needs ~110: raise the cap there.
    c.rollout.context_cap = 256 + 64 * turns
    # On a CPU the KV cache is the memory: 64 sessions of 30 blocks x 1,280 positions take ~4 GB
    # (an eval of 64 tasks was killed for memory on a shared 24 GB machine). Eight decode rows and
    # eight live sessions keep it to ~0.5 GB; the sessions are the same (docs/rollout.md).
    if a["rollout"] != "tree":  # trees fork rows in the lockstep layout
      c.rollout.update(continuous=True, rows=8, in_flight=8)
    c.eval.tasks = 32
    c.eval.every = 8
    c.checkpoint.every = 4
  if a["runlocal"]:
    shrink(c)
    c.env.kwargs.max_turns = min(turns, 8)
    c.rollout.context_cap = 1024
    if a["model"] == "smol":
      c.sft.batch_size = 4
  return c
