"""Critics: a separate value network, or a value head on the policy's trunk.

Both give one value per token position: V at token t estimates the return
from that point of the session on.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mtrl_jax.models import layout, lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.layers import _param
from mtrl_jax.models.transformer import Transformer


class ValueHead(nnx.Module):
  """Scalar projection of hidden states; zero-initialised so V starts at 0."""

  def __init__(self, dim: int, dtype, *, rngs: nnx.Rngs):
    self.w = _param(rngs, nnx.initializers.zeros, (dim,), ("embed",), dtype)
    self.b = _param(rngs, nnx.initializers.zeros, (), (), dtype)

  def __call__(self, h_btd: jax.Array) -> jax.Array:
    return (jnp.einsum("btd,d->bt", h_btd.astype(jnp.float32), self.w[...].astype(jnp.float32))
            + self.b[...].astype(jnp.float32))


class Critic(nnx.Module):
  """A value network with its own trunk (no LM head) and a scalar head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.trunk = Transformer(cfg, rngs=rngs, lm_head=False)
    self.head = ValueHead(cfg.dim, cfg.weight_dtype, rngs=rngs)

  def __call__(self, tokens_bt: jax.Array, positions_bt=None, *, segment_ids_bt=None) -> jax.Array:
    h, _ = self.trunk.hidden(tokens_bt, positions_bt=positions_bt, segment_ids_bt=segment_ids_bt)
    return self.head(h)

  @classmethod
  def from_policy(cls, policy: Transformer, *, rngs: nnx.Rngs) -> "Critic":
    """A critic whose trunk starts as a copy of the policy's (the usual warm start)."""
    critic = cls(policy.cfg, rngs=rngs)
    copy_trunk(policy, critic.trunk)
    return critic


def copy_trunk(src: Transformer, dst: Transformer) -> None:
  """Copies every trunk parameter (embedding, blocks, final norm) src -> dst.

  The two may differ in block layout (`ModelConfig.scan_layers`): src's
  blocks are stacked or unstacked to dst's first. LoRA adapters are not
  trunk weights: src's adapters are folded into the copied weights, dst's
  own adapters are left as they are.
  """
  src_state = lora.merged(nnx.state(src, nnx.Param), src.cfg.lora)
  dst_state = nnx.state(dst, nnx.All(nnx.Param, nnx.Not(lora.ADAPTER)))
  src_flat = nnx.to_flat_state(src_state)
  src_flat = dict(layout.stack_flat(src_flat) if dst.cfg.scan_layers else layout.unstack_flat(src_flat))
  missing = []
  for path, var in nnx.to_flat_state(dst_state):
    if path not in src_flat:
      missing.append("/".join(map(str, path)))
      continue
    var.set_value(jnp.array(src_flat[path].get_value()))
  if missing:
    raise ValueError(f"source trunk lacks parameters {missing}")
  nnx.update(dst, dst_state)


# critic.kind="lora": the Critic's own state is its trunk's adapters and its
# head; the rest of the trunk is the policy's frozen base, borrowed at call time
# (one trunk, two adapters).
SHARED_TRUNK_OWN = nnx.Any(lora.ADAPTER, nnx.PathContains("head"))


def trunk_from_policy(policy_state: nnx.State) -> nnx.State:
  """The policy's trunk weights (embedding, blocks, final norm; no adapters, no LM head)
  under the paths a Critic holds them ('trunk', ...)."""
  out = []
  for path, var in nnx.to_flat_state(policy_state):
    path = tuple(path)
    if isinstance(var, lora.ADAPTER) or path[0] == "lm_head":
      continue
    out.append((("trunk",) + path, var))
  return nnx.from_flat_state(out)


def with_policy_trunk(own: nnx.State, policy_state: nnx.State) -> nnx.State:
  """A shared-trunk critic's full state: its own adapters and head plus the policy's trunk
  (through stop_gradient: the value loss never moves the policy)."""
  trunk = jax.tree.map(jax.lax.stop_gradient, trunk_from_policy(policy_state))
  return nnx.merge_state(own, trunk)


class PolicyWithValueHead(nnx.Module):
  """The option of one shared trunk: the policy plus a value head on its hidden states."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, policy: Transformer | None = None):
    self.policy = policy if policy is not None else Transformer(cfg, rngs=rngs)
    self.value_head = ValueHead(cfg.dim, cfg.weight_dtype, rngs=rngs)

  def __call__(self, tokens_bt: jax.Array, positions_bt=None, *, segment_ids_bt=None):
    h, _ = self.policy.hidden(tokens_bt, positions_bt=positions_bt, segment_ids_bt=segment_ids_bt)
    return self.policy.logits(h), self.value_head(h)
