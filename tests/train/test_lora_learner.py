"""LoRA in the learner: only adapters (and value heads) move, the frozen base
has no optimiser state and keeps its arrays, and the critic of
critic.kind="lora" is adapters + a head on the policy's trunk."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mtrl_jax import config as config_lib
from mtrl_jax.models import lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic, trunk_from_policy
from mtrl_jax.parallel.sharded_init import create_sharded, state_shardings
from mtrl_jax.parallel.sharded_step import (init_opt_state, opt_state_shardings, sharding_context,
                                            split_trainable)
from mtrl_jax.train import adapters
from mtrl_jax.train.learner import Learner
from mtrl_jax.train.lm_step import LMBatch, make_lm_train_step
from mtrl_jax.train.rl_step import RLBatch, StepFlags
from tiny_world import TOK, host, sessions_v0, tiny_config, world

RANK = 4


def lora_config(critic="none", **rl):
  c = tiny_config(critic, **rl)
  c.model.lora.update(rank=RANK, alpha=8.0)
  return c


def policy_params(c):
  mesh, rules = world()[:2]
  mc = ModelConfig.from_dict(c.model)
  return nnx.split(create_sharded(lambda: Transformer(mc, rngs=nnx.Rngs(0)), mesh, rules))


def split_flat(tree):
  """({path: array} of the adapters, {path: array} of everything else) of a host copy."""
  ad, rest = {}, {}
  for path, var in nnx.to_flat_state(tree):
    (ad if isinstance(var, lora.ADAPTER) else rest)[tuple(path)] = np.asarray(var.get_value())
  return ad, rest


def n_elements(tree) -> int:
  return sum(int(np.size(x)) for x in jax.tree.leaves(tree) if np.ndim(x) > 0)


def test_lora_update_changes_only_the_adapters():
  """One RL update of a LoRA policy: every base weight is bit-identical after
  it (its arrays are the very same objects: never donated), the adapters moved
  by about lr, and the optimiser state holds exactly 2 moments per adapter
  element (nothing for the base, 8x larger here).

  Break checked: Learner.policy_trainable forced to None (train everything)
  moves the base and gives the optimiser base moments: both assertions fail.
  """
  mesh, rules = world()[:2]
  c = lora_config()
  gd, params = policy_params(c)
  lrn = Learner(c, mesh, rules, policy_gd=gd, policy_params=params, total_updates=8, tokenizer=TOK)
  ad0, base0 = split_flat(host(lrn.state.policy))
  base_arrays = jax.tree.leaves(lora.base(lrn.state.policy))
  assert n_elements(base0) > 8 * n_elements(ad0)
  assert n_elements(lrn.state.opt_policy) == 2 * n_elements(ad0)

  met = lrn.update(list(sessions_v0()), 0)
  assert met["update/nonfinite_steps"] == 0 and met["sessions/trained"] > 0
  ad1, base1 = split_flat(host(lrn.state.policy))
  assert base1.keys() == base0.keys()
  for k in base0:
    np.testing.assert_array_equal(base1[k], base0[k], err_msg=str(k))
  assert all(a is b for a, b in zip(jax.tree.leaves(lora.base(lrn.state.policy)), base_arrays))
  moved = max(np.abs(ad1[k] - ad0[k]).max() for k in ad0 if str(k[-1]).endswith(lora.B_SUFFIX))
  assert moved > 0.5 * c.rl.lr, moved
  assert n_elements(lrn.state.opt_policy) == 2 * n_elements(ad0)


def _shared_trunk_learner(c, policy_gd, policy_params):
  mesh, rules = world()[:2]
  mc = ModelConfig.from_dict(c.model)
  cgd, own = adapters.shared_trunk_critic(c, mc, mesh, rules, seed=2)
  return Learner(c, mesh, rules, policy_gd=policy_gd, policy_params=policy_params, critic_gd=cgd,
                 critic_params=own, total_updates=8, tokenizer=TOK)


def full_critic_values(lrn, tokens, positions):
  """The oracle: a whole Critic with the policy's trunk weights copied in and the learner's critic adapters."""
  c = lrn.c
  ccfg = dataclasses.replace(ModelConfig.from_dict(c.model), lora=config_lib.critic_lora(c))
  critic = nnx.eval_shape(lambda: Critic(ccfg, rngs=nnx.Rngs(0)))
  gd, state = nnx.split(critic)
  flat = dict((tuple(p), v) for p, v in nnx.to_flat_state(trunk_from_policy(host(lrn.state.policy))))
  flat.update((tuple(p), v) for p, v in nnx.to_flat_state(host(lrn.state.critic)))
  full = [(p, v.replace(jnp.asarray(flat[tuple(p)].get_value()))) for p, v in nnx.to_flat_state(state)]
  return np.asarray(nnx.merge(gd, nnx.from_flat_state(full))(jnp.asarray(tokens), jnp.asarray(positions)))


def test_shared_trunk_critic_trains_its_adapters_on_the_policy_trunk():
  """critic.kind="lora": the critic's state is its adapters and head only (no
  trunk weights); an update with GAE moves the policy's adapters, the critic's
  adapters and head, never the base; the values it scores equal a whole Critic
  built from the policy's trunk plus those adapters. Value pretraining
  (train_policy=False) leaves the policy exactly as it was.

  Break checked: trunk_from_policy taking the policy's adapters too (not only
  its base) puts them over the critic's own, which then never move (the
  critic-adapter assertion fails).
  """
  c = lora_config("lora", estimator="gae")
  gd, params = policy_params(c)
  lrn = _shared_trunk_learner(c, gd, params)
  for path, var in nnx.to_flat_state(lrn.state.critic):
    assert isinstance(var, lora.ADAPTER) or path[0] == "head", path
  p_ad0, p_base0 = split_flat(host(lrn.state.policy))
  c_ad0, c_head0 = split_flat(host(lrn.state.critic))

  # Two updates: the zero-initialised head passes no gradient to the critic's adapters in the first.
  for step in range(2):
    met = lrn.update(list(sessions_v0()), step)
    assert met["update/nonfinite_steps"] == 0
  p_ad1, p_base1 = split_flat(host(lrn.state.policy))
  c_ad1, c_head1 = split_flat(host(lrn.state.critic))
  for k in p_base0:
    np.testing.assert_array_equal(p_base1[k], p_base0[k], err_msg=str(k))
  for name, before, after, lr in (("policy adapters", p_ad0, p_ad1, c.rl.lr), ("critic adapters", c_ad0, c_ad1,
                                  c.rl.critic_lr), ("critic head", c_head0, c_head1, c.rl.critic_lr)):
    assert max(np.abs(after[k] - before[k]).max() for k in before) > 0.5 * lr, name

  pb = lrn._pack(list(sessions_v0()))
  _, _, values = lrn.score(pb)
  want = full_critic_values(lrn, pb.tokens_bt, pb.positions_bt)
  assert np.abs(want).max() > 1e-3  # the head moved off zero
  np.testing.assert_allclose(values, want, rtol=1e-4, atol=1e-6)
  # The critic alone (the readout's and value pretraining's path): the same values.
  # Break checked: make_values_fn without the policy's trunk (a KeyError on the trunk's weights).
  np.testing.assert_allclose(lrn.critic_values(pb), want, rtol=1e-4, atol=1e-6)

  policy_before = host(lrn.state.policy)
  critic_before = host(lrn.state.critic)
  lrn.update(list(sessions_v0()), 2, train_policy=False)
  for a, b in zip(jax.tree.leaves(policy_before), jax.tree.leaves(host(lrn.state.policy))):
    np.testing.assert_array_equal(a, b)
  assert any(np.abs(a - b).max() > 0 for a, b in zip(jax.tree.leaves(critic_before),
                                                      jax.tree.leaves(host(lrn.state.critic))))


def test_value_loss_never_reaches_a_fully_trained_policy_through_the_shared_trunk():
  """A full (no-adapter) policy with a shared-trunk critic: with zero
  advantages the policy loss has no gradient, so the policy must not move at
  all while the critic does (its trunk is the policy's, behind stop_gradient).
  The critic's head is made nonzero first: at its zero init no gradient
  reaches the trunk whatever the code does.

  Break checked: with_policy_trunk without stop_gradient moves the policy.
  """
  c = tiny_config("lora", estimator="gae")
  c.critic.lora.rank = RANK
  gd, params = policy_params(c)
  lrn = _shared_trunk_learner(c, gd, params)
  assert lrn.policy_trainable is None
  rng = np.random.default_rng(0)
  b, t = 8, 16
  tok = rng.integers(8, 200, (b, t)).astype(np.int32)
  zeros = np.zeros((b, t), np.float32)
  batch = RLBatch(tokens_bt=tok, targets_bt=np.roll(tok, -1, 1), positions_bt=np.tile(np.arange(t, dtype=np.int32),
                                                                                      (b, 1)),
                  loss_mask_bt=np.ones((b, t), np.float32), behav_logp_bt=zeros - 5.0, prox_logp_bt=zeros - 5.0,
                  ref_logp_bt=zeros - 5.0, adv_bt=zeros, value_target_bt=rng.normal(size=(b, t)).astype(np.float32),
                  old_value_bt=zeros, turn_idx_bt=np.zeros((b, t), np.int32), success_bt=zeros)
  # A nonzero head: the zero-initialised one passes no gradient back into the trunk at all.
  flat = [(p, v.replace(jnp.asarray(np.random.default_rng(1).normal(size=v.get_value().shape), jnp.float32))
           if p[0] == "head" else v) for p, v in nnx.to_flat_state(lrn.state.critic)]
  lrn.state = lrn.state._replace(critic=nnx.from_flat_state(flat))
  before_p, before_c = host(lrn.state.policy), host(lrn.state.critic)
  with sharding_context(lrn.mesh, lrn.rules):
    met = lrn.step(lrn._put(batch), StepFlags(jnp.float32(1), jnp.float32(1), jnp.float32(0)))
  assert float(met["nonfinite"]) == 0
  for a, b_ in zip(jax.tree.leaves(before_p), jax.tree.leaves(host(lrn.state.policy))):
    np.testing.assert_array_equal(a, b_)
  assert max(np.abs(a - b_).max() for a, b_ in zip(jax.tree.leaves(before_c),
                                                    jax.tree.leaves(host(lrn.state.critic)))) > 0.5 * c.rl.critic_lr


def test_lm_step_with_a_frozen_base_trains_only_the_adapters():
  """The SFT step with frozen_shardings: adapters move, the base is neither
  changed nor donated, and the loss falls over a few steps.

  The break check of the stage that uses it is in test_lora_run.py
  (test_sft_stage_trains_only_the_adapters).
  """
  mesh, rules = world()[:2]
  c = lora_config()
  gd, params = policy_params(c)
  train, frozen = split_trainable(params, lora.ADAPTER)
  p_sh, f_sh = split_trainable(state_shardings(params, mesh, rules), lora.ADAPTER)
  tx = optax.adam(1e-2)
  o_sh = opt_state_shardings(tx, train, p_sh, mesh)
  opt = init_opt_state(tx, train, o_sh)
  step = make_lm_train_step(gd, tx, mesh, rules, p_sh, o_sh, frozen_shardings=f_sh)
  rng = np.random.default_rng(0)
  batch = LMBatch(rng.integers(8, 200, (4, 12)).astype(np.int32), np.ones((4, 12), np.float32))
  base0 = host(frozen)
  ad0 = host(train)
  losses = []
  for _ in range(4):
    train, opt, met = step(train, opt, batch, frozen)
    losses.append(float(met["loss"]))
  for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(host(frozen))):
    np.testing.assert_array_equal(a, b)
  assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(ad0), jax.tree.leaves(host(train)))) > 5e-3
  assert losses[-1] < losses[0] - 1e-3, losses


@pytest.mark.parametrize("mode", ["merge", "apply"])
def test_sampler_decodes_the_adapted_policy_in_both_modes(mode):
  """The sampler's view of an adapted policy (train/adapters.sampler_setup):
  "merge" decodes the base graph with merged weights, "apply" the adapted
  graph; both give the adapted policy's greedy tokens and log-probs (1e-4),
  which differ from the base policy's.

  Break checked: sampler_setup's merge without the adapters (lora.base
  instead of lora.merged) decodes the base policy: the tokens match the base's.
  """
  from mtrl_jax.parallel.sampler_mesh import SamplerWeights
  from mtrl_jax.sampling.sampler import Sampler, SamplingParams
  c = lora_config()
  c.model.lora.sampler = mode
  mc = ModelConfig.from_dict(c.model)
  gd, params = nnx.split(Transformer(mc, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(1)
  flat = []
  for path, var in nnx.to_flat_state(params):
    if str(path[-1]).endswith(lora.B_SUFFIX):
      var = var.replace(jnp.asarray(0.5 * rng.standard_normal(var.get_value().shape), jnp.float32))
    flat.append((path, var))
  params = nnx.from_flat_state(flat)
  sgd, moving, finish = adapters.sampler_setup(mc, gd)
  weights = SamplerWeights(params, world()[1], moving=moving, finish=finish)
  prompts = [[5, 9, 30, 31, 7], [40, 41, 42]]

  def greedy(graphdef, p):
    s = Sampler(graphdef, p, pad_id=0, stop_ids=(), log_compiles=False)
    st = s.append(s.init_state(2, 64), prompts)
    out, _ = s.generate(st, jax.random.key(0), 12, params=SamplingParams(greedy=True))
    return np.asarray(out.tokens), np.asarray(out.logps)

  got_tok, got_lp = greedy(sgd, weights(params))
  want_tok, want_lp = greedy(gd, params)
  base_gd = nnx.split(Transformer(dataclasses.replace(mc, lora=lora.OFF), rngs=nnx.Rngs(0)))[0]
  base_tok, _ = greedy(base_gd, lora.base(params))
  np.testing.assert_array_equal(got_tok, want_tok)
  np.testing.assert_allclose(got_lp, want_lp, rtol=1e-4, atol=1e-4)
  assert not np.array_equal(want_tok, base_tok)
