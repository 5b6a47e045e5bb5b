"""TextWorld (coin collector, treasure hunter, cooking): warm start on walkthroughs, then RL.

  python -m mtrl_jax.main --config=configs/textworld.py --workdir=/tmp/tw_cc5
  python -m mtrl_jax.main --config=configs/textworld.py:level=10 --workdir=/tmp/tw_cc10
  python -m mtrl_jax.main --config=configs/textworld.py:kind=cooking --workdir=/tmp/tw_cook
  python -m mtrl_jax.main --config=configs/textworld.py:runlocal=true --workdir=/tmp/tw_smoke
  python -m mtrl_jax.main --config=configs/textworld.py:model=smol --workdir=/tmp/tw_smol

The byte model (model=byte, the default) reads the terse view (room, exits, visible
objects, the last feedback; <= 300 characters a turn) and is warm-started by
behaviour cloning on demos of the walkthrough expert that take a random admissible
command instead 1 - quality of the time (re-planned by textworld from where they
strayed), then trained by RL on the training games and evaluated on the held-out
games. model=smol: SmolLM2-135M-Instruct with its chat template (configs/smol.py's
pieces), the game's own text (style=natural) with the admissible commands listed.

The game pools are built on first use (tw-make's generator, in parallel) and cached
under $MTRL_TEXTWORLD_DIR or ~/.cache/mtrl_jax/textworld (envs/textworld/pool.py).
Args: kind (coin_collector | treasure_hunter | cooking), level (coin collector /
treasure hunter), games, eval_games, quality (the demos'), context (session: one
sample per session | history | markov: one sample per turn with the transcript or
only the current observation), estimator, model (byte | smol), hf_dir, seed, runlocal;
lab=true (with tasks, group, k) makes it the credit-accuracy lab's config:
  python -m mtrl_jax.lab.credit_accuracy --config=configs/textworld.py:lab=true --workdir=/tmp/tw_lab
Cooking's knobs are tw-make's: --config.env.kwargs.recipe=3 (default here: recipe 1,
take 1, cut: the kitchen only, 4 points). Measured: docs/tasks.md.
"""
from configs import smol
from configs.common import default_config, shrink
from mtrl_jax.config import env_kwargs_for
from mtrl_jax.config_args import parse_args

KINDS = ("coin_collector", "treasure_hunter", "cooking")
MODELS = ("byte", "smol")
CONTEXTS = ("session", "history", "markov")
# The cooking setting of the learnability table: one room (the kitchen), one ingredient to find
# and cut, then the meal: 4 points (take, cut, prepare, eat), a walkthrough of ~6 commands.
COOKING = {"recipe": 1, "take": 1, "cut": True}


def max_turns_for(kind: str, level: int) -> int:
  """Room to stray: one and a half times the quest length (coin collector / treasure hunter) plus 2."""
  return {"cooking": 12}.get(kind, level + level // 2 + 2)


def get_config(arg=None):
  a = parse_args(arg, {"kind": "coin_collector", "level": 5, "games": 200, "eval_games": 64,
                       "quality": 0.7, "context": "session", "estimator": "ms_grpo", "model": "byte",
                       "hf_dir": "", "seed": 0, "lab": False, "tasks": 8, "group": 4, "k": 8,
                       "runlocal": False})
  if a["kind"] not in KINDS:
    raise ValueError(f"kind={a['kind']!r}: choose one of {KINDS}")
  if a["model"] not in MODELS:
    raise ValueError(f"model={a['model']!r}: choose one of {MODELS}")
  if a["context"] not in CONTEXTS:
    raise ValueError(f"context={a['context']!r}: choose one of {CONTEXTS}")
  if a["hf_dir"] and a["model"] != "smol":
    raise ValueError(f"hf_dir={a['hf_dir']!r}: only model=smol reads a pretrained folder")
  kind, level = a["kind"], a["level"]
  max_turns = max_turns_for(kind, level)
  games, eval_games = (8, 4) if a["runlocal"] else (a["games"], a["eval_games"])
  knobs = dict(COOKING) if kind == "cooking" else {"level": level}
  natural = a["model"] == "smol"
  c = default_config()
  c.seed = a["seed"]
  c.env.name = "textworld"
  c.env.kwargs = env_kwargs_for("textworld", kind=kind, games=games, eval_games=eval_games,
                                max_turns=max_turns, style="natural" if natural else "terse",
                                list_commands=natural, **knobs)
  c.critic.kind = "none"
  c.value_pretrain.enabled = False
  c.rl.estimator = a["estimator"]
  if a["context"] != "session":
    c.rl.layout, c.rl.context = "turn", a["context"]
  c.demos.quality = a["quality"]
  c.demos.episodes = 400  # two sessions of each of the 200 training games
  # Sized for the 2-core CPU: a level-10 session is ~1,000 bytes (tokens) at this quality. 150
  # steps left the direction to take unlearned (level 5: loss 0.30 a token, 90% of the commands
  # inadmissible, success 0); copying from the observation takes several hundred (configs/lab.py).
  c.sft.steps = 600
  c.sft.batch_size = 8
  c.rl.steps = 20
  c.rl.tasks_per_update = 4
  c.rl.group_size = 8
  c.rl.lr = 5e-4
  c.rollout.turn_budget = 32  # "take pork chop from fridge" is 26 bytes
  # Terse turns are ~30-60 bytes of observation plus the command; cooking's kitchen ~150-300.
  per_turn = 280 if kind == "cooking" else 64
  c.rollout.context_cap = 128 + per_turn * max_turns
  c.eval.every = 10  # the warm start (step 0), half way, the end
  c.eval.tasks = 64  # 64 held-out games
  c.eval.greedy = False
  c.checkpoint.every = 5
  c.log.tensorboard = False
  if natural:
    _smol(c, a)
  if a["lab"]:
    _lab(c, a)
  if a["runlocal"]:
    shrink(c)
    c.demos.episodes = 16
    c.eval.tasks = 4
    if natural:
      c.sft.batch_size = 4
    if a["lab"]:
      c.value_pretrain.update(steps=2, tasks_per_round=2, minibatches=1, epochs=1)
      c.lab.update(tasks=2, continuations=2, resamples=2, coupled_critic_rounds=1, rows_per_call=16,
                   progress_tasks=2, progress_steps=2)
      c.checkpoint.every = 10**6
  return c


def _lab(c, a: dict) -> None:
  """The credit-accuracy lab (mtrl_jax/lab/credit_accuracy.py) on this setting: the warm start (or
  --config.init_from=<a run's workdir> to reuse its), a separate critic fitted by value pretraining
  on Monte-Carlo targets as configs/lab.py does, and the lab block (N = tasks x group sessions on
  held-out games, K continuations from every turn, each fork a replay of the session's prefix)."""
  from configs.lab import lab_block
  c.stages = ("demos", "sft", "value_pretrain")
  c.critic.kind = "separate"
  c.value_pretrain.enabled = True
  c.rl.estimator = "gae"
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 1.0}
  c.rl.group_size = a["group"]
  c.rl.minibatches = 1
  c.checkpoint.every = 10**6  # save only at stage ends
  c.lab = lab_block(a["tasks"], a["k"])
  c.lab.rows_per_call = 64


def _smol(c, a: dict) -> None:
  """SmolLM2-135M-Instruct (configs/smol.py's pieces) on the game's own text, its admissible
  commands listed; SFT on pure walkthroughs (quality 1.0), then RL. Sized for a CPU: a 135M
  model's update over ~1k-token sessions takes minutes there."""
  smol.use_pretrained(c, a["hf_dir"] or smol.DEFAULT_HF_DIR)
  if a["kind"] != "cooking":  # the quest plus 3 turns to stray: short sessions, a small context
    c.env.kwargs.max_turns = a["level"] + 3
  c.demos.episodes = 64
  c.demos.quality = 1.0 if a["quality"] == 0.7 else a["quality"]  # the walkthroughs (unless set)
  c.sft.steps = 16
  c.sft.batch_size = 8
  c.rl.steps = 8
  c.rl.tasks_per_update = 4
  c.rl.group_size = 4
  c.rl.minibatches = 2
  c.rollout.turn_budget = 12  # one command; a chatty reply is cut and read leniently
  # The system prompt and the first text (~200 tokens), then ~80-130 tokens a turn with the commands.
  c.rollout.context_cap = 384 + 160 * c.env.kwargs.max_turns
  c.eval.every = 8
  c.eval.tasks = 32
  c.eval.greedy = False
  c.checkpoint.every = 4
  # 16 sessions at once on 16 decode rows: the KV cache of 64 evaluation sessions at this context
  # (30 blocks, fp32 on a CPU: ~5 GB) got the zero-shot evaluation killed on the shared 24 GB machine.
  c.rollout.update(continuous=True, rows=16, in_flight=16)
