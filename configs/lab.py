"""The credit-accuracy lab (mtrl_jax/lab/credit_accuracy.py, docs/lab.md).

  python -m mtrl_jax.lab.credit_accuracy --config=configs/lab.py --workdir=/tmp/lab
  python -m mtrl_jax.lab.credit_accuracy --config=configs/lab.py:length=4,runlocal=true --workdir=/tmp/lab_s

Default: `memory` with 8 distractor turns (10 turns), a warm start of 600 steps of
behaviour cloning on quality-0.5 demos (the policy peeks about half the time and then
copies the code: sampled success about 0.5), a separate critic fitted by 16 rounds of
value pretraining, N = tasks x group_size sessions, K continuations per turn.
Args: length, tasks, group, k, hint (memory's hint; the study's probe has none), env (any registered env, with its default kwargs;
`length` applies to memory and bifurcation), runlocal (a smoke-test size).
"""
from configs.common import default_config, shrink
from mtrl_jax.config_args import parse_args
import ml_collections


def lab_block(tasks: int, k: int) -> ml_collections.ConfigDict:
  """The lab's own settings (`config.lab`), shared by configs/lab_smol.py."""
  return ml_collections.ConfigDict(dict(
      tasks=tasks,               # N = tasks x group sessions (same task seed within a group)
      continuations=k,           # K Monte-Carlo continuations per history
      resamples=8,               # bootstrap resamples of the batch (the variance column)
      seed_offset=2_000_000,     # task seeds, disjoint from training and eval seeds
      coupled_critic_rounds=4,   # value-pretraining rounds on lambda = 0.95 targets (0: skip that variant)
      rows_per_call=256,         # continuation rows decoded together
      fork_randomness="fresh",   # 'fresh': each fork draws the env randomness not yet seen; 'crn': keeps the session's
      estimators=(),             # () = all (mtrl_jax/lab/variants.py)
      progress_tasks=32,         # the progress head learns from these tasks x group sessions (a quarter
      progress_steps=150,        # held out) in up to this many full-batch steps, kept at its best held-out loss
  ))


def get_config(arg=None):
  a = parse_args(arg, {"length": 8, "tasks": 8, "group": 4, "k": 16, "env": "memory", "hint": True,
                       "runlocal": False})
  c = default_config(a["length"])
  c.env.kwargs.hint = a["hint"]  # hint=false: the study's memory probe (recall over the distractors)
  if a["env"] != "memory":
    c.env.name = a["env"]
    # `length` is bifurcation's and cashout's too (turns between the choice and the payoff).
    c.env.kwargs = {"length": a["length"]} if a["env"] in ("bifurcation", "cashout") else {}
  if a["env"] == "cashout":
    # The per-turn-normalisation probe: the demos' mistake is to cash out (stop), at each of the
    # `length` turns with probability 1 - quality; 0.9 leaves about 0.9^8 = 43% of the demos
    # reaching the payoff at length 8, so the policy stops at every turn index now and then.
    c.demos.quality = 0.9
  # With hint=True the recall over 8 distractors is not needed, the copying is: the loss
  # sits on a plateau (token accuracy ~0.6, success ~0.1) until ~200 steps, then the copy is
  # learned; 600 steps end at accuracy ~0.96 and sampled success ~0.5 (half the demos skip),
  # so the turn-0 choice has a large true advantage. ~1.2 steps/s on one loaded CPU core.
  c.sft.steps = 600
  c.sft.batch_size = 16
  c.stages = ("demos", "sft", "value_pretrain")  # the warm start and its critic; skipped when done
  c.critic.kind = "separate"
  c.rl.estimator = "gae"  # value pretraining fits Monte-Carlo targets (lambda_critic = 1)
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 1.0}
  # Value pretraining at its defaults (train/value_pretrain.py): Monte-Carlo targets, 32-task
  # rounds, an optimiser of its own, until the critic is at the bar, stops improving or reaches its
  # cap (train/vp_stop.py; 160 fixed critic steps before issue 43).
  c.rl.group_size = a["group"]
  c.rl.minibatches = 1
  c.checkpoint.every = 10**6  # save only at stage ends
  c.log.tensorboard = False
  c.lab = lab_block(a["tasks"], a["k"])
  if a["runlocal"]:
    shrink(c)
    c.value_pretrain.update(steps=2, tasks_per_round=2, minibatches=1, epochs=1)
    c.lab.update(tasks=2, continuations=4, resamples=2, coupled_critic_rounds=1, rows_per_call=32,
                 progress_tasks=2, progress_steps=5)
    c.checkpoint.every = 10**6
  return c
