"""Shared programs (mtrl_jax/compile/programs.py) never hand one run another's program.

Issue 42's bug: the advantage program of a `gae` learner with lambda 1, built
after one with lambda 0.95 in the same process, returned the first one's
advantages (its key left the estimator's options out). Here, in one process,
pairs of learners (and samplers, value-pretraining critics, seeded inits, sft
steps) that differ in exactly one field a shared program reads are built one
after the other, and their outputs on the same inputs must differ, far beyond
float noise (the base built twice agrees to 1e-6).

`FIELDS` lists every field of every spec and the pair that varies it, or why
none can (a field that only changes shapes or layouts): a field added to a
spec without a pair here fails `test_every_spec_field_has_a_pair`.

Breaks checked (scratch copy): AdvantageProgram hashed and compared on its
name only (the issue's bug) -> the gae lambda_policy, lambda_critic and gamma
pairs fail ("same output"); RLStepProgram's eq/hash without value_clip -> the
value_clip pair fails. And, one at a time, `shared` keyed on the spec less one
field, for every paired field: its pair fails "same output". A pair must vary
its field alone: the policy/critic graphdef pairs once changed both models (and
the decoupled pair the loss's behaviour cap too), so each of those fields could
leave the key unseen; the critic's value head, zero at init, is drawn here so its
graphdef shows in the values.
"""
import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.compile.programs import Program, Tree, frozen, shared
from mtrl_jax.config import base_config
from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.losses import PolicyLossConfig
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic
from mtrl_jax.parallel.mesh import mesh_from_config
from mtrl_jax.parallel.rules import rules_from_config
from mtrl_jax.parallel.sharded_init import ModelOf, SeededInit, create_sharded
from mtrl_jax.parallel.sharded_step import init_opt_state, opt_state_shardings
from mtrl_jax.sampling.sampler import DecodePrograms, Sampler, SamplingParams
from mtrl_jax.train import optim
from mtrl_jax.train.credit_step import AdvantageProgram
from mtrl_jax.train.learner import Learner
from mtrl_jax.train.lm_step import LMBatch, LMStepProgram
from mtrl_jax.train.rl_step import RLBatch, RLStepProgram, ScoreProgram, StepFlags, ValuesProgram
from mtrl_jax.train.value_pretrain import ValueBatch, ValueFitProgram, ValuePretrainer

TOK = ByteTokenizer()
B, T = 4, 16
MODEL = dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32)
NOISE = 1e-6  # the base against itself: float noise at most
FAR = 1e-3  # a pair's outputs must differ by more than this


def _config(**rl):
  c = base_config()
  c.model.update(MODEL)
  c.critic.kind = "separate"
  c.env.name, c.env.kwargs = "bifurcation", {"length": 1}
  c.rl.update(estimator="gae", minibatches=1, epochs=1, lr=1e-2, critic_lr=1e-2, warmup_steps=0, decoupled=True,
              is_cap=5.0, value_clip=0.2, value_coef=0.5, kl_coef=0.05, kl_mode="loss", kl_type="k3",
              entropy_coef=0.01, eps_low=0.2, eps_high=0.28)
  c.rl.estimator_kwargs = {"lambda_policy": 0.95, "lambda_critic": 0.95, "gamma": 1.0}
  c.value_pretrain.update(lr=0.05, steps=4, warmup_steps=0)
  for k, v in rl.items():
    section, _, name = k.rpartition(".")
    node = c
    for part in section.split(".") if section else ["rl"]:
      node = node[part]
    node[name] = v
  return c


@functools.lru_cache(maxsize=None)
def _world(model_items=(), critic_items=()):
  """(mesh, rules, policy (gd, params), critic (gd, params)) of a tiny model; cached per model change.
  `model_items` change the policy's ModelConfig only and `critic_items` the critic's only, so a pair
  varies one graphdef (a change to both would differ in two spec fields: one left out of a key would
  go unseen)."""
  c = _config()
  base = ModelConfig.from_dict(c.model)
  mc, mc_critic = (dataclasses.replace(base, **dict(items)) for items in (model_items, critic_items))
  mesh = mesh_from_config(c.mesh, devices=jax.devices()[:1])
  rules = rules_from_config(c.mesh)
  policy = nnx.split(create_sharded(lambda: Transformer(mc, rngs=nnx.Rngs(0)), mesh, rules))
  critic = nnx.split(create_sharded(lambda: Critic(mc_critic, rngs=nnx.Rngs(1)), mesh, rules))
  # Weights x 4: peaked distributions, so a graphdef switch (rope, compute dtype) moves log-probs by far more
  # than FAR (at the init's scale the untrained model is near uniform and hides it). The critic's value head
  # starts at zero (values 0 whatever the trunk): drawn here, so the critic's graphdef shows in its values.
  r = np.random.default_rng(2)
  head = lambda x: x if np.any(np.asarray(x)) else r.normal(0, 0.5, x.shape).astype(x.dtype)  # noqa: E731
  critic = (critic[0], jax.tree.map(head, critic[1]))
  return mesh, rules, *((gd, jax.tree.map(lambda x: x * 4.0, p)) for gd, p in (policy, critic))


def _copy(tree):
  return jax.tree.map(lambda x: np.array(x), jax.device_get(tree))


def _learner(model=(), critic_model=(), **rl) -> Learner:
  mesh, rules, (pgd, pp), (cgd, cp) = _world(tuple(sorted(model)), tuple(sorted(critic_model)))
  c = _config(**rl)
  return Learner(c, mesh, rules, policy_gd=pgd, policy_params=_copy(pp), critic_gd=cgd, critic_params=_copy(cp),
                 ref_params=_copy(pp), total_updates=4, tokenizer=TOK)


def _rl_batch() -> RLBatch:
  """Ratios spread around 1 (prox, behav, ref log-probs near the untrained model's ~ -log 264), advantages of
  both signs, old values away from the critic's: every clip, cap, mask and coefficient of the step binds."""
  r = np.random.default_rng(0)
  tokens = r.integers(3, 200, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b, n in enumerate((12, 9, 15, 6)):
    mask[b, 1:n] = 1.0
  base = -np.log(264.0)
  behav = (base + r.normal(0, 0.3, (B, T))).astype(np.float32)
  return RLBatch(tokens_bt=tokens, targets_bt=np.roll(tokens, -1, 1), positions_bt=np.tile(np.arange(T), (B, 1)),
                 loss_mask_bt=mask, behav_logp_bt=behav,
                 prox_logp_bt=(behav + r.normal(0, 0.3, (B, T))).astype(np.float32),
                 ref_logp_bt=(base + r.normal(0, 0.3, (B, T))).astype(np.float32),
                 adv_bt=r.normal(0, 1, (B, T)).astype(np.float32),
                 value_target_bt=r.normal(0, 1, (B, T)).astype(np.float32),
                 old_value_bt=r.normal(0, 1, (B, T)).astype(np.float32),
                 turn_idx_bt=(np.arange(T)[None] >= T // 2).astype(np.int32).repeat(B, 0),
                 success_bt=np.array([1, 1, 0, 0], np.float32)[:, None].repeat(T, 1))


def _credit_batch() -> CreditBatch:
  r = np.random.default_rng(1)
  mask = np.asarray(_rl_batch().loss_mask_bt)
  reward = np.zeros((B, T), np.float32)
  turn = np.asarray(_rl_batch().turn_idx_bt)
  for b in range(B):
    reward[b, np.nonzero(mask[b])[0][[0, -1]]] = r.normal(0, 1, 2)  # a reward on each turn's ends
  return CreditBatch(reward_bt=reward, loss_mask_bt=mask, turn_idx_bt=turn, group_id_b=np.array([0, 0, 1, 1]),
                     episode_id_b=np.arange(B), tree_id_b=np.arange(B), return_b=reward.sum(1),
                     value_bt=r.normal(0, 1, (B, T)).astype(np.float32))


def _flat(out) -> np.ndarray:
  if isinstance(out, dict):
    out = [out[k] for k in sorted(out)]
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(out)])


# ------------------------------------------------------------------ what each kind of pair runs
def run_step(model=(), critic_model=(), **rl):
  """A learner's RL step on the fixed batch: its metrics and the moved policy and critic."""
  lrn = _learner(model, critic_model, **rl)
  met = lrn.step(RLBatch(*_rl_batch()), StepFlags(np.float32(1), np.float32(1), np.float32(0)))
  return {"metrics": jax.device_get(met), "policy": _copy(lrn.state.policy), "critic": _copy(lrn.state.critic)}


def run_score(model=(), critic_model=(), **rl):
  """A learner's scoring program (log-probs, reference log-probs, values) on the batch's tokens."""
  lrn = _learner(model, critic_model, **rl)
  b = _rl_batch()
  return _copy(lrn._score(lrn.state.policy, lrn.state.critic, lrn.ref_params, b.tokens_bt, b.targets_bt,
                          b.positions_bt))


def run_values(model=(), critic_model=(), **rl):
  """A learner's values program (the critic alone, Learner.critic_values's) on the batch's tokens."""
  lrn = _learner(model, critic_model, **rl)
  b = _rl_batch()
  return _copy(lrn._values(lrn.state.policy, lrn.state.critic, b.tokens_bt, b.positions_bt))


def run_advantages(model=(), **rl):
  """A learner's advantage program on the fixed credit batch: (advantages, value targets)."""
  return _copy(_learner(model, **rl).credit.adv_fn(_credit_batch()))


def run_value_fit(model=(), critic_model=(), **over):
  """A value-pretraining critic's fit step on the batch (train/value_pretrain.py): moved critic, loss."""
  lrn = _learner(model, critic_model, **over)
  vp = ValuePretrainer(lrn, lrn.c)
  b = _rl_batch()
  opt = init_opt_state(vp.tx, vp.params, vp.o_sh)
  params, _, met = vp._step(vp.params, opt, ValueBatch(b.tokens_bt, b.positions_bt, b.value_target_bt,
                                                       b.loss_mask_bt))
  return {"critic": _copy(params), "metrics": jax.device_get(met)}


def run_sampler(model=(), stop_ids=(1,), pad_id=0):
  """Two rows decoded after a prompt each (temperature 1, fixed key): tokens and log-probs."""
  _, _, (gd, params), _ = _world(tuple(sorted(model)))
  s = Sampler(gd, _copy(params), pad_id=pad_id, stop_ids=list(stop_ids), log_compiles=False)
  state = s.append(s.init_state(2, 32), [[5, 6, 7], [8, 9]])
  out, _ = s.generate(state, jax.random.key(0), 8, params=SamplingParams(temperature=1.0))
  tokens = np.full((2, 8), -1)
  for i, t in enumerate(out.tokens):
    tokens[i, :len(t)] = t
  return {"tokens": tokens, "logps": [np.asarray(x) for x in out.logps]}


def run_init(model=()):
  """A seeded, shared init (create_sharded of a ModelOf): the parameters it writes."""
  mesh, rules, _, _ = _world()
  mc = dataclasses.replace(ModelConfig.from_dict(_config().model), **dict(model))
  return _copy(nnx.state(create_sharded(ModelOf(Transformer, mc), mesh, rules, seed=0)))


def run_lm_step(model=(), lr=1e-2):
  """The sft stage's step (train/lm_step.py) once on the batch's tokens: the moved policy and metrics."""
  mesh, rules, (gd, params), _ = _world(tuple(sorted(model)))
  tx = optim.adamw(lr, 4)
  from mtrl_jax.parallel.sharded_init import state_shardings
  p_sh = state_shardings(params, mesh, rules)
  o_sh = opt_state_shardings(tx, params, p_sh, mesh)
  step = shared(LMStepProgram(gd, tx, mesh, tuple(rules), Tree(p_sh), Tree(o_sh), Tree(None)))
  b = _rl_batch()
  batch = LMBatch(b.tokens_bt, b.loss_mask_bt, b.positions_bt)
  new, _, met = step(_copy(params), init_opt_state(tx, _copy(params), o_sh), batch)
  return {"policy": _copy(new), "metrics": jax.device_get(met)}


ROPE = (("rope_theta", 50.0),)  # same shapes, other numbers: another graphdef
# (spec field, what runs, base kwargs, the one change): one pair per field of each spec.
PAIRS = [
    ("AdvantageProgram.options", run_advantages, {}, {"estimator_kwargs": {"lambda_policy": 1.0,
                                                                             "lambda_critic": 0.95, "gamma": 1.0}}),
    ("AdvantageProgram.options", run_advantages, {}, {"estimator_kwargs": {"lambda_policy": 0.95,
                                                                             "lambda_critic": 1.0, "gamma": 1.0}}),
    ("AdvantageProgram.name", run_advantages, {}, {"estimator": "turn_gae"}),
    # PolicyLossConfig is one frozen dataclass: every loss setting is in its eq (checked below); one pair
    # shows the step keeps two loss configs apart.
    ("RLStepProgram.loss_cfg", run_step, {}, {"eps_low": 0.02}),
    ("RLStepProgram.value_coef", run_step, {}, {"value_coef": 3.0}),
    ("RLStepProgram.value_clip", run_step, {}, {"value_clip": 0.0}),
    # rl.decoupled also sets the loss's behaviour cap (PolicyLossConfig.behav_cap, None when not decoupled):
    # with is_cap None on both sides only the step's own flag differs.
    ("RLStepProgram.decoupled", run_step, {"is_cap": None}, {"decoupled": False}),
    ("RLStepProgram.tx_policy", run_step, {}, {"lr": 1e-3}),
    ("RLStepProgram.tx_critic", run_step, {}, {"critic_lr": 1e-3}),
    ("RLStepProgram.policy_gd", run_step, {}, {"model": ROPE}),
    ("RLStepProgram.critic_gd", run_step, {}, {"critic_model": ROPE}),
    ("ScoreProgram.policy_gd", run_score, {}, {"model": ROPE}),
    ("ScoreProgram.critic_gd", run_score, {}, {"critic_model": ROPE}),
    ("ValuesProgram.critic_gd", run_values, {}, {"critic_model": ROPE}),
    ("ValueFitProgram.tx", run_value_fit, {}, {"value_pretrain.lr": 0.005}),
    ("ValueFitProgram.critic_gd", run_value_fit, {}, {"critic_model": ROPE}),
    ("DecodePrograms.stop_ids", run_sampler, {}, {"stop_ids": tuple(range(1, 264))}),  # every row stops at once
    ("DecodePrograms.graphdef", run_sampler, {}, {"model": ROPE}),
    ("SeededInit.factory", run_init, {}, {"model": (("mlp_dim", 24),)}),
    ("LMStepProgram.optimizer", run_lm_step, {}, {"lr": 1e-3}),
    ("LMStepProgram.graphdef", run_lm_step, {}, {"model": ROPE}),
]

# Fields no pair varies alone, and why.
UNPAIRED = {
    "RLStepProgram.shared_trunk": "set by critic.kind='lora', which changes critic_gd and the state's structure too",
    "ScoreProgram.shared_trunk": "as RLStepProgram.shared_trunk",
    "ScoreProgram.policy_trainable": "set by LoRA adapters, which change policy_gd and the state's structure too",
    "ValuesProgram.policy_gd": "read only by a value head (critic.kind='head'): with a separate critic the values "
                               "do not depend on it; the head's forward is ScoreProgram's (its policy_gd pair)",
    "ValuesProgram.shared_trunk": "as RLStepProgram.shared_trunk",
    "ValueFitProgram.policy_gd": "read only by a value head (critic.kind='head'), whose policy_gd pair is RLStepProgram's",
    "ValueFitProgram.donate": "donation changes which buffers are reused, not the numbers",
    "DecodePrograms.pad_id": "written only where no row decodes: the outputs cannot show it (the tokens are cut)",
    "SeededInit.rules": "logical rules: a layout, the same numbers by design (tests/parallel/test_sharded_init.py)",
}
LAYOUT = ("train_shardings", "frozen_shardings", "replicated", "shardings", "param_shardings", "opt_shardings",
          "mesh", "rules")  # where the arrays live: the same numbers by design
SPECS = (AdvantageProgram, RLStepProgram, ScoreProgram, ValuesProgram, ValueFitProgram, DecodePrograms, SeededInit,
         LMStepProgram)


def _call(run, kw):
  kw = dict(kw)
  if run in (run_sampler, run_init, run_lm_step):
    return run(**kw)
  model = kw.pop("model", ())
  return run(model, **kw)


@functools.lru_cache(maxsize=None)
def _base(run, base=()):
  """The base's output, built first in this process (so a pair's program would be the base's if keyed wrongly)."""
  return _flat(_call(run, dict(base)))


@pytest.mark.parametrize("field,run,base,change", PAIRS, ids=[f"{p[0]}:{sorted(p[3])}" for p in PAIRS])
def test_a_pair_that_differs_in_one_field_gets_its_own_program(field, run, base, change):
  """The base runs first, then the one-field change, in this process: the outputs differ by more than FAR
  while the base run twice agrees to NOISE."""
  first = _base(run, tuple(sorted(base.items())))
  again = _flat(_call(run, base))
  assert first.shape == again.shape and np.max(np.abs(first - again)) <= NOISE * max(1.0, np.abs(first).max())
  other = _flat(_call(run, {**base, **change}))
  assert other.shape != first.shape or np.max(np.abs(other - first)) > FAR, f"{field}: same output as the base"


def test_every_spec_field_has_a_pair():
  """Every field of every shared program's spec is varied by a pair above, or named in UNPAIRED / LAYOUT with
  the reason. Catches a field added to a spec with no pair checking that its programs are kept apart."""
  paired = {p[0] for p in PAIRS}
  for spec in SPECS:
    for f in dataclasses.fields(spec):
      name = f"{spec.__name__}.{f.name}"
      assert name in paired or name in UNPAIRED or f.name in LAYOUT, f"{name}: no pair varies it"


def test_specs_are_frozen_dataclasses_keyed_by_every_field():
  """`shared` takes only a frozen Program dataclass whose fields all enter eq and hash: a field
  marked compare=False (out of the key) is refused with its name. Catches the check dropped."""
  for spec in (*SPECS, PolicyLossConfig, ModelConfig):  # the loss and model settings specs hold
    assert dataclasses.is_dataclass(spec) and spec.__dataclass_params__.frozen, spec
    assert all(f.compare and f.hash is not False for f in dataclasses.fields(spec)), spec
  assert all(issubclass(spec, Program) for spec in SPECS)

  @dataclasses.dataclass(frozen=True)
  class Hidden(Program):
    name: str
    options: tuple = dataclasses.field(default=(), compare=False)

    def build(self):
      return self.options

  with pytest.raises(TypeError, match=r"\['options'\]"):
    shared(Hidden("x", (1,)))

  @dataclasses.dataclass
  class Mutable(Program):
    name: str

  with pytest.raises(TypeError, match="frozen dataclass"):
    shared(Mutable("x"))
  assert frozen({"b": [1, 2], "a": 1.0}) == (("a", 1.0), ("b", (1, 2)))
