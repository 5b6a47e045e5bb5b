"""What a run does with LoRA adapters (models/lora.py, docs/lora.md).

With `config.model.lora.rank > 0` the policy's base is frozen for the whole
run (every stage trains the adapters only), so a checkpoint holds the
adapters and a record of where the base comes from (`base_record`): the HF
folder, the `init_from` run, or the seed of a random init. A resumed run
rebuilds the base from the same source and refuses to go on if it is not
the same base (a fingerprint of its weights).

The critic of `critic.kind="lora"` is a `Critic` whose trunk carries its own
adapters; only those and its value head are its state, the trunk weights are
the policy's frozen base (one trunk, two adapters).

The sampler takes the adapters either folded into the weights once per
published version (`lora.sampler="merge"`: decoding costs what the base
costs) or as they are (`"apply"`: no merged copy of the weights).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mtrl_jax import config as config_lib
from mtrl_jax.models import lora
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import SHARED_TRUNK_OWN, Critic
from mtrl_jax.parallel.sharded_init import create_sharded_part
from mtrl_jax.parallel.sharded_step import fetch_replicated

FINGERPRINT_RTOL = 1e-5  # fp32 sums over one leaf, reduced in another order on another mesh


def shared_trunk_critic(c, mc: ModelConfig, mesh, rules, seed: int):
  """(graphdef of the whole Critic, its own state: trunk adapters + value head), created sharded."""
  ccfg = dataclasses.replace(mc, lora=config_lib.critic_lora(c))
  return create_sharded_part(lambda: Critic(ccfg, rngs=nnx.Rngs(seed)), SHARED_TRUNK_OWN, mesh, rules)


def sampler_setup(mc: ModelConfig, policy_gd):
  """(sampler graphdef, moving filter, finish fn) for SamplerWeights and the Sampler.

  Without adapters: the policy's graphdef, everything moves, nothing to finish.
  """
  if not mc.lora.enabled:
    return policy_gd, None, None
  if mc.lora.sampler == "apply":
    return policy_gd, lora.ADAPTER, None
  base_cfg = dataclasses.replace(mc, lora=lora.OFF)
  graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(base_cfg, rngs=nnx.Rngs(0))))[0]
  return graphdef, lora.ADAPTER, functools.partial(lora.merged, cfg=mc.lora)


@jax.jit
def _leaf_sums(leaves):
  return jnp.stack([jnp.stack([jnp.sum(x.astype(jnp.float32)), jnp.sum(jnp.square(x.astype(jnp.float32)))])
                    for x in leaves])


def fingerprint(state) -> list:
  """[sum, sum of squares] of every base leaf (adapters excluded), as host floats."""
  leaves = jax.tree.leaves(lora.base(state))
  # A global program on several hosts (every process calls it): a replicated result each reads.
  return np.asarray(fetch_replicated(_leaf_sums(leaves)), np.float64).tolist()


def base_record(c, policy_state) -> dict:
  """Where the frozen base of this run comes from, its size and fingerprint (saved in every checkpoint)."""
  if c.init_from:
    source = {"kind": "init_from", "path": os.path.abspath(c.init_from)}
  elif c.hf_dir:
    source = {"kind": "hf_dir", "path": os.path.abspath(c.hf_dir)}
  else:
    source = {"kind": "seed", "seed": int(c.seed)}
  base = lora.base(policy_state)
  return {**source, "params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(base))),
          "fingerprint": fingerprint(policy_state)}


def check_base(saved: dict, now: dict) -> None:
  """Refuses to resume adapters on another base than the one they were trained on."""
  where = {"init_from": "config.init_from", "hf_dir": "config.hf_dir", "seed": "config.seed"}
  for key in ("kind", "path", "seed", "params"):
    if saved.get(key) != now.get(key):
      raise ValueError(
          f"the checkpoint's LoRA adapters were trained on the base {_describe(saved)}, but this run's base "
          f"is {_describe(now)}: keep {where.get(saved.get('kind'), 'the base')} as it was")
  a, b = np.asarray(saved["fingerprint"]), np.asarray(now["fingerprint"])
  if a.shape != b.shape or not np.allclose(a, b, rtol=FINGERPRINT_RTOL, atol=1e-6):
    raise ValueError(f"the base weights at {_describe(now)} changed since the checkpoint's adapters were "
                     f"trained on them (fingerprint differs); restore that base or start a new workdir")


def _describe(rec: dict) -> str:
  if rec.get("kind") == "seed":
    return f"random init of seed {rec.get('seed')} ({rec.get('params')} parameters)"
  return f"{rec.get('kind')}={rec.get('path')!r} ({rec.get('params')} parameters)"
