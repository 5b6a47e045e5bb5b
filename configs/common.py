"""What the config families share: the default job, a smoke-test size, and `:ARGS` knobs."""
from mtrl_jax.config import base_config, env_kwargs_for
from mtrl_jax.config_args import parse_args


def default_config(length: int = 3):
  """The main job's settings (see configs/default.py)."""
  c = base_config()
  c.env.name = "memory"
  c.env.kwargs.length = length
  # The final question repeats a peeked code, and codes are letters like the
  # echo distractors: a 2-layer byte model then learns recall from the demos
  # in a few hundred steps for every seed tried (digits: some seeds never do).
  c.env.kwargs.hint = True
  c.env.kwargs.code_alphabet = "letters"
  c.critic.kind = "none"  # MS-GRPO needs no critic; configs/ppo.py shows value pretraining
  c.demos.episodes = 1000
  c.demos.quality = 0.5
  c.sft.steps = 800  # 500 left some seeds with a half-learned recall
  c.rl.estimator = "ms_grpo"
  c.rl.steps = 60
  c.rl.lr = 5e-4  # 1e-3 collapsed to `skip` on some seeds (benchmarks/RESULTS.md, async section)
  c.rollout.turn_budget = 8
  c.rollout.context_cap = 256
  c.eval.every = 10
  c.eval.tasks = 64
  return c


def shrink(c):
  """A smoke-test size of any config: every stage runs, briefly."""
  c.demos.episodes = 64
  c.sft.steps = 20
  c.sft.batch_size = 8
  c.value_pretrain.steps = 2
  c.value_pretrain.tasks_per_round = 2
  c.value_pretrain.epochs = 1
  c.value_pretrain.minibatches = 1
  c.value_pretrain.readout_tasks = 0  # one round: the smoke size reads the critic on it
  c.rl.steps = 3
  c.rl.tasks_per_update = 2
  c.rl.group_size = 4
  c.rl.minibatches = 1
  c.eval.every = 2
  c.eval.tasks = 4
  c.checkpoint.every = 1
  c.log.tensorboard = False
  return c


def build(arg, *, estimators, default_estimator, critic, extra=None):
  defaults = {"estimator": default_estimator, "env": "memory", "horizon": 3, "gamma": 1.0,
              "seed": 0, "runlocal": False, **(extra or {})}
  a = parse_args(arg, defaults)
  if a["estimator"] not in estimators:
    raise ValueError(f"estimator={a['estimator']!r} is not in this family {estimators}")
  c = default_config()
  c.seed = a["seed"]
  c.env.name = a["env"]
  c.env.kwargs = {"memory": {"length": a["horizon"], "hint": True, "code_alphabet": "letters"}, "keydoor": {"size": a["horizon"] + 2},
                  "repair": {"bugs": max(1, a["horizon"] // 3)}}.get(a["env"], {})
  if a["env"] == "textarena":  # every argument present: --config.env.kwargs.game=Sokoban-v0 works
    c.env.kwargs = env_kwargs_for("textarena")
  c.critic.kind = critic
  c.rl.estimator = a["estimator"]
  kw = {}
  if a["estimator"] in ("return_to_go", "gae", "turn_gae", "bilevel_gae"):
    kw["gamma"] = a["gamma"]
  if a["estimator"] in ("gae", "turn_gae", "bilevel_gae"):
    kw["lambda_policy"] = a["lambda_policy"]
    kw["lambda_critic"] = a["lambda_critic"]
    kw["length_adaptive"] = a["adaptive"]
  c.rl.estimator_kwargs = kw
  if "context" in a:
    c.rl.layout = a["layout"]
    c.rl.context = a["context"]
  if a["runlocal"]:
    shrink(c)
  return c
