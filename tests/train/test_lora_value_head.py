"""LoRA policy x critic.kind "head" and "separate" (issue 34).

With a value head on the policy's trunk, the head trains with the adapters
while the base stays frozen; a separate critic starts on the merged policy
and trains whole. The other LoRA x critic-kind combinations (none, lora) are
in test_lora_learner.py / test_lora_run.py, which never ran these two.
"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax.models import lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import PolicyWithValueHead
from mtrl_jax.parallel.sharded_init import create_sharded
from mtrl_jax.parallel.sharded_step import sharding_context
from mtrl_jax.train.learner import Learner
from tiny_world import TOK, host, sessions_v0, tiny_config, world


def _flat(tree) -> dict:
  return {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(tree)}


def test_lora_policy_with_a_value_head_trains_the_head_and_the_adapters_only():
  """A LoRA policy with critic.kind="head" and GAE, 3 updates: the value
  head's weights move by more than half the learning rate, the adapters move,
  every base weight is bit-identical, and the values the learner scores are
  no longer the zero-initialised head's zeros.

  Bug caught (issue 34, checked on a scratch edit): Learner's trainable
  filter naming "head" instead of "value_head" (`lora_trainable(policy_params,
  "head")`) leaves the value head frozen: it moves 0.0 and the values stay 0,
  so the head-moved assertion fails.
  """
  mesh, rules = world()[:2]
  c = tiny_config("head", estimator="gae")
  c.model.lora.update(rank=4, alpha=8.0)
  mc = ModelConfig.from_dict(c.model)
  policy = create_sharded(lambda: Transformer(mc, rngs=nnx.Rngs(0)), mesh, rules)
  gd, params = nnx.split(PolicyWithValueHead(mc, rngs=nnx.Rngs(1), policy=policy))
  lrn = Learner(c, mesh, rules, policy_gd=gd, policy_params=params, total_updates=8, tokenizer=TOK)
  before = _flat(host(lrn.state.policy))
  assert any(k[0] == "value_head" for k in before)

  for step in range(3):
    met = lrn.update(list(sessions_v0()), step)
    assert met["update/nonfinite_steps"] == 0
  after = _flat(host(lrn.state.policy))
  assert after.keys() == before.keys()

  moved = {k: float(np.abs(after[k] - before[k]).max()) for k in before}
  head = max(v for k, v in moved.items() if k[0] == "value_head")
  adapters = max(v for k, v in moved.items() if str(k[-1]).endswith(lora.B_SUFFIX))
  base = {k: v for k, v in moved.items() if k[0] != "value_head" and not any(
      str(part).endswith((lora.A_SUFFIX, lora.B_SUFFIX)) for part in k)}
  assert head > 0.5 * c.rl.lr, head
  assert adapters > 0.5 * c.rl.lr, adapters
  assert base and max(base.values()) == 0.0, {k: v for k, v in base.items() if v}

  _, _, values = lrn.score(lrn._pack(list(sessions_v0())))
  assert np.abs(np.asarray(values)).max() > 1e-3


def _hidden(model, tokens):
  h, _ = model.hidden(jnp.asarray(tokens), positions_bt=jnp.asarray(np.tile(np.arange(tokens.shape[1]),
                                                                              (tokens.shape[0], 1))))
  return np.asarray(h)


def test_lora_policy_with_a_separate_critic_starts_it_on_the_merged_policy_and_trains_it_whole():
  """The other LoRA x critic-kind combination no quick test ran: a LoRA
  policy with critic.kind="separate". The critic starts as the policy's
  trunk with the policy's adapters merged in (docs/lora.md): after the
  adapters are made nonzero, the critic trunk's hidden states equal the LoRA
  policy's (and differ from the bare base's by far more than the tolerance).
  Two GAE updates then move the policy's adapters only (base bit-identical)
  and the critic's trunk and head both (a full model: no adapter filter).

  Breaks checked (scratch edits of train/run.py::_init_critic_from_policy):
  copying the policy's state without `lora_lib.merged` (the base alone) fails
  the hidden-state comparison (the critic misses the adapters' delta).
  """
  import dataclasses
  import types

  from mtrl_jax.models.value import Critic
  from mtrl_jax.train.run import Run
  mesh, rules = world()[:2]  # one device: the learner compiles in seconds
  c = tiny_config("separate", estimator="gae")
  c.model.lora.update(rank=4, alpha=8.0)
  mc = ModelConfig.from_dict(c.model)
  gd, params = nnx.split(create_sharded(lambda: Transformer(mc, rngs=nnx.Rngs(0)), mesh, rules))
  cgd, cparams = nnx.split(create_sharded(lambda: Critic(dataclasses.replace(mc, lora=lora.OFF),
                                                         rngs=nnx.Rngs(2)), mesh, rules))
  L = Learner(c, mesh, rules, policy_gd=gd, policy_params=params, critic_gd=cgd, critic_params=cparams,
              total_updates=8, tokenizer=TOK)
  # Run's own warm start of the critic, on the attributes it reads.
  run = types.SimpleNamespace(meta={}, c=c, learner=L, model_cfg=mc)
  # Nonzero adapters (B starts at 0, where merging changes nothing).
  rng = np.random.default_rng(0)
  flat = [(p, v.replace(jnp.asarray(0.3 * rng.normal(size=v.get_value().shape), v.get_value().dtype))
           if str(p[-1]).endswith(lora.B_SUFFIX) else v) for p, v in nnx.to_flat_state(L.state.policy)]
  L.state = L.state._replace(policy=nnx.from_flat_state(flat))
  Run._init_critic_from_policy(run)
  assert run.meta["critic_ready"]

  tokens = np.random.default_rng(1).integers(3, 200, (2, 9)).astype(np.int32)
  with sharding_context(L.mesh, L.rules):
    policy = nnx.merge(L.policy_gd, L.state.policy)
    critic = nnx.merge(L.critic_gd, L.state.critic)
    base = nnx.merge(L.policy_gd, nnx.from_flat_state(
        [(p, v.replace(jnp.zeros_like(v.get_value())) if str(p[-1]).endswith(lora.B_SUFFIX) else v)
         for p, v in nnx.to_flat_state(L.state.policy)]))
    h_policy, h_critic, h_base = _hidden(policy, tokens), _hidden(critic.trunk, tokens), _hidden(base, tokens)
  assert np.abs(h_policy - h_base).max() > 1e-2
  np.testing.assert_allclose(h_critic, h_policy, rtol=1e-4, atol=1e-5)

  before_p, before_c = _flat(host(L.state.policy)), _flat(host(L.state.critic))
  for step in range(2):  # the zero-initialised head passes no gradient to the trunk in the first
    assert L.update(list(sessions_v0()), step)["update/nonfinite_steps"] == 0
  after_p, after_c = _flat(host(L.state.policy)), _flat(host(L.state.critic))
  is_adapter = lambda k: any(str(x).endswith((lora.A_SUFFIX, lora.B_SUFFIX)) for x in k)  # noqa: E731
  assert max(float(np.abs(after_p[k] - before_p[k]).max()) for k in before_p if is_adapter(k)) > 0.5 * c.rl.lr
  assert all(np.array_equal(after_p[k], before_p[k]) for k in before_p if not is_adapter(k))
  for part in ("trunk", "head"):
    moved = max(float(np.abs(after_c[k] - before_c[k]).max()) for k in before_c if k[0] == part)
    assert moved > 0.5 * c.rl.critic_lr, (part, moved)
