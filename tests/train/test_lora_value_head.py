"""LoRA policy x critic.kind="head": the value head on the policy's trunk trains
with the adapters while the base stays frozen (issue 34).

The other LoRA x critic-kind combinations (none, lora, separate) are in
test_lora_learner.py / test_lora_run.py; this is the one they missed.
"""
import jax
import numpy as np
from flax import nnx

from mtrl_jax.models import lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import PolicyWithValueHead
from mtrl_jax.parallel.sharded_init import create_sharded
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
