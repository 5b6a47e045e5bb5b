"""The credit-accuracy lab on a real pretrained model (SmolLM2-135M-Instruct by default).

  python -m mtrl_jax.lab.credit_accuracy --config=configs/lab_smol.py --workdir=/tmp/lab_smol
  python -m mtrl_jax.lab.credit_accuracy --config=configs/lab_smol.py:critic=true,length=8 --workdir=...

The policy, its chat template, learning rates and warm start are configs/smol.py's
(natural-language env, behaviour cloning on demos that take the tempting wrong
turn-0 action 70% of the time); the lab block is configs/lab.py's. Continuations
render every turn through the model's own template (lab/continuations.py).

Default: bifurcation in natural language, 4 turns between the choice and the
payoff, no critic: on a CPU, value pretraining a separate 135M critic is most of
the cost (critic=true adds it and the critic-based rows), and the progress head
fine-tunes a copy of the trunk (add `progress` to lab.estimators to score it).
Args: hf_dir, env (memory | bifurcation), length, tasks, group, k, critic, seed,
runlocal (smoke size; with a 2-layer conversion it runs in minutes).
"""
from configs import smol
from configs.common import shrink
from configs.lab import lab_block
from mtrl_jax.config_args import parse_args

NO_CRITIC = ("ms_grpo", "grpo", "rloo", "return_to_go", "gigpo", "hgpo", "mt_grpo")


def get_config(arg=None):
  a = parse_args(arg, {"hf_dir": smol.DEFAULT_HF_DIR, "env": "bifurcation", "length": 4, "tasks": 8,
                       "group": 4, "k": 8, "critic": False, "seed": 0, "runlocal": False})
  if a["env"] not in ("memory", "bifurcation"):
    raise ValueError(f"env={a['env']!r}: the lab's probes are memory and bifurcation")
  c = smol.get_config(f"hf_dir={a['hf_dir']},env={a['env']},horizon={a['length']},seed={a['seed']},"
                      f"estimator={'gae' if a['critic'] else 'ms_grpo'}")
  c.stages = ("demos", "sft", "value_pretrain") if a["critic"] else ("demos", "sft")
  if a["critic"]:
    # Value pretraining fits Monte-Carlo targets (lambda_critic = 1), as in configs/lab.py.
    c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 1.0}
    c.value_pretrain.lr = 1e-4  # a pretrained trunk: the byte model's 1e-3 is refused
  c.rl.group_size = a["group"]
  c.rl.minibatches = 1
  # Every history of a session plus one action must fit: the natural-style prompt is ~150
  # tokens, a distractor turn ~25 more.
  c.rollout.context_cap = max(512, 256 + 48 * (a["length"] + 2))
  c.checkpoint.every = 10**6  # save only at stage ends
  c.lab = lab_block(a["tasks"], a["k"])
  c.lab.rows_per_call = 128
  c.lab.estimators = () if a["critic"] else NO_CRITIC
  if a["runlocal"]:
    shrink(c)
    c.sft.batch_size = 4
    c.value_pretrain.update(steps=2, tasks_per_round=2, minibatches=1, epochs=1)
    c.lab.update(tasks=2, continuations=2, resamples=2, coupled_critic_rounds=1, rows_per_call=16,
                 progress_tasks=2, progress_steps=2)
    c.checkpoint.every = 10**6
  return c
