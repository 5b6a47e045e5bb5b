"""BabyAI levels (minigrid) in words: the byte model from scratch, or SmolLM2-135M-Instruct.

  python -m mtrl_jax.main --config=configs/babyai.py --workdir=/tmp/babyai_gotoredball
  python -m mtrl_jax.main --config=configs/babyai.py:level=OpenDoor --workdir=...
  python -m mtrl_jax.main --config=configs/babyai.py:model=smol,level=GoToObj --workdir=...
  python -m mtrl_jax.main --config=configs/babyai.py:runlocal=true --workdir=...   (every stage, minutes on a CPU)

model=byte: the tiny byte-level decoder, warm-started by behaviour cloning on the BabyAI bot's
demos (a share `quality` of its actions, the rest random), then RL (MS-GRPO by default) on the
terse rendering (envs/babyai_text.py, at most 238 characters an observation). Every turn of a
session stays in the sampler's cache, so `context_cap` must hold a whole session: the level's
`max_turns` are chosen from the bot's turn counts (docs/tasks.md) and the cap from them.
model=smol: configs/smol.py's pretrained policy (its chat template, pretrained learning rates) on
the natural rendering (sentences).
Args: level, max_turns (0: LEVELS' value, else 32), quality, model (byte | smol), hf_dir,
estimator (ms_grpo | grpo | gae ...; gae adds a critic), context (history | markov: what the
turn layout trains on; history = the session layout), seed, runlocal.
Measured: docs/tasks.md (BabyAI section).
"""
from configs import smol
from configs.common import shrink
from mtrl_jax.config import base_config, env_kwargs_for
from mtrl_jax.config_args import parse_args

MODELS = ("byte", "smol")
# Per level: (max_turns, byte-model context_cap). Turns: about three times the bot's mean walk
# on a pool of 50 seeds (its longest walks: 14, 13, 25 turns); the cap holds max_turns turns of a
# mean observation plus the action (terse: ~80, ~32 and ~38 characters a turn for these three).
LEVELS = {"GoToRedBall": (20, 2048), "GoToObj": (16, 1024), "GoToRedBallNoDists": (16, 1024),
          "OpenRedDoor": (16, 1024), "OpenDoor": (24, 1536), "PickupLoc": (20, 2048),
          "UnlockLocal": (40, 2048)}


def get_config(arg=None):
  a = parse_args(arg, {"level": "GoToRedBall", "max_turns": 0, "quality": 0.7, "model": "byte",
                       "hf_dir": "", "estimator": "ms_grpo", "context": "history", "seed": 0,
                       "runlocal": False})
  if a["model"] not in MODELS:
    raise ValueError(f"model={a['model']!r}: choose one of {MODELS}")
  if a["hf_dir"] and a["model"] != "smol":
    raise ValueError(f"hf_dir={a['hf_dir']!r}: only model=smol reads a pretrained folder")
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

  c.demos.episodes = 1000
  c.demos.quality = a["quality"]
  c.rollout.turn_budget = 8     # the longest action word is 7 bytes
  c.rollout.context_cap = cap
  c.rollout.temperature = 1.0
  c.sft.steps = 600
  c.sft.batch_size = 16
  c.sft.pack = True  # demos run 100-2,000 bytes: one per padded row wasted ~70% (runlocal)
  c.rl.pack = True
  c.rl.steps = 60
  c.rl.lr = 5e-4
  c.rl.tasks_per_update = 8
  c.rl.group_size = 8
  c.eval.every = 10
  c.eval.tasks = 64
  c.checkpoint.every = 10
  c.log.tensorboard = False
  if a["model"] == "smol":
    smol.use_pretrained(c, a["hf_dir"] or smol.DEFAULT_HF_DIR)
    c.demos.episodes = 256
    c.sft.steps = 32
    c.sft.batch_size = 8
    c.rl.steps = 16
    c.rl.group_size = 8
    c.rl.tasks_per_update = 4
    c.rollout.turn_budget = 8  # one-word replies; longer ones are cut
    # The natural prompt is ~170 tokens, a turn ~40-120 (a one-room view lists up to 8 objects).
    c.rollout.context_cap = 256 + 96 * turns
    c.eval.tasks = 64
    c.eval.every = 4
    c.checkpoint.every = 4
  if a["runlocal"]:
    shrink(c)
    c.env.kwargs.max_turns = min(turns, 8)
    c.rollout.context_cap = 1024
    if a["model"] == "smol":
      c.sft.batch_size = 4
  return c
