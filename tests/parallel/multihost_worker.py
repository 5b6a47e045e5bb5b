"""One process of a two-process CPU run, and the pieces the test shares with it.

Run as a script it joins the run described by the MTRL_* environment, trains
the tiny LM a few steps on a global batch of which it feeds only its own rows,
and prints one line `RESULT {json}`.
"""
from __future__ import annotations

import json
import sys

import numpy as np

GLOBAL_BATCH, SEQ, STEPS, MESH_SHAPE = 8, 12, 3, (2, 2, 2)


def tiny_config():
  from mtrl_jax.models.config import ModelConfig
  return ModelConfig(vocab_size=264, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)


def global_batch(seed: int = 0):
  from mtrl_jax.train.lm_step import LMBatch
  rng = np.random.default_rng(seed)
  tokens = rng.integers(8, 264, (GLOBAL_BATCH, SEQ)).astype(np.int32)
  mask = (rng.random((GLOBAL_BATCH, SEQ)) < 0.7).astype(np.float32)
  return LMBatch(tokens, mask)


def train_losses(mesh):
  """Losses of STEPS Adam steps on this process's rows of the global batch."""
  import optax
  from flax import nnx

  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.parallel import fetch_replicated, get_rules, process_batch_rows
  from mtrl_jax.train.lm_step import LMBatch, build_lm_trainer

  cfg, rules = tiny_config(), get_rules("default")
  trainer = build_lm_trainer(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), optax.adam(1e-2), mesh, rules)
  rows = process_batch_rows(GLOBAL_BATCH, mesh, rules)
  local = LMBatch(*(None if x is None else x[rows] for x in global_batch()))
  losses = [float(fetch_replicated(trainer.train_step(local))["loss"]) for _ in range(STEPS)]
  return losses, rows, trainer


def sampler_weights_check(trainer) -> dict:
  """The trained weights moved to this host's sampling mesh: where they live, and whether they
  equal the global weights (max abs difference over all leaves)."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils

  from mtrl_jax.parallel import get_rules
  from mtrl_jax.parallel.sampler_mesh import SamplerWeights

  weights = SamplerWeights(trainer.params, get_rules("default"))
  local = weights(trainer.params)
  devices = sorted({d.id for x in jax.tree.leaves(local) for d in x.sharding.device_set})
  full = multihost_utils.process_allgather(trainer.params, tiled=True)
  diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(local), jax.tree.leaves(full)))
  return dict(sampler_devices=devices, local_devices=sorted(d.id for d in jax.local_devices()),
              sampler_max_diff=diff, fully_addressable=all(x.is_fully_addressable for x in jax.tree.leaves(local)))


def lora_sampler_check(mesh) -> dict:
  """SamplerWeights with LoRA: the first call sends base + adapters, a later one (new adapters,
  same base arrays) only the adapters; the local weights equal the global ones, applied or merged."""
  import dataclasses
  import functools

  import jax
  import numpy as np
  from flax import nnx
  from jax.experimental import multihost_utils

  from mtrl_jax.models import lora
  from mtrl_jax.models.transformer import Transformer
  from mtrl_jax.parallel import create_sharded, get_rules
  from mtrl_jax.parallel.sampler_mesh import SamplerWeights, _tree_bytes

  cfg = dataclasses.replace(tiny_config(), lora=lora.LoraConfig(rank=4, alpha=8.0))
  rules = get_rules("default")
  params = nnx.state(create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh, rules))
  adapters, base = nnx.split_state(params, lora.ADAPTER, ...)
  weights = SamplerWeights(params, rules, moving=lora.ADAPTER)
  weights(params)
  sent_first = weights.last_sent_bytes
  moved = nnx.merge_state(jax.jit(lambda t: jax.tree.map(lambda x: x + 0.1, t))(adapters), base)  # an "update"
  local = weights(moved)
  sent_second = weights.last_sent_bytes
  want = multihost_utils.process_allgather(moved, tiled=True)
  apply_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(local), jax.tree.leaves(want)))
  merging = SamplerWeights(moved, rules, moving=lora.ADAPTER, finish=functools.partial(lora.merged, cfg=cfg.lora))
  merged_local = merging(moved)
  merged_want = lora.merged(jax.tree.map(np.asarray, want), cfg.lora)
  merge_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(merged_local), jax.tree.leaves(merged_want)))
  from mtrl_jax.train.adapters import fingerprint  # a global program over the sharded base
  return dict(fingerprint=fingerprint(params),
              adapter_bytes=_tree_bytes(adapters), base_bytes=_tree_bytes(base), sent_first=sent_first,
              sent_second=sent_second, apply_max_diff=apply_diff, merge_max_diff=merge_diff,
              merged_leaves=len(jax.tree.leaves(merged_local)), base_leaves=len(jax.tree.leaves(base)),
              fully_addressable=all(x.is_fully_addressable for x in jax.tree.leaves(merged_local)))


def main() -> int:
  import jax

  from mtrl_jax.parallel import initialize_from_config, make_mesh

  info = initialize_from_config(None)  # everything comes from the MTRL_* environment
  mesh = make_mesh(MESH_SHAPE)
  data_hosts = [sorted({d.process_index for d in mesh.devices[i].flat}) for i in range(mesh.shape["data"])]
  losses, rows, trainer = train_losses(mesh)
  print("RESULT " + json.dumps(dict(process_id=info.process_id, num_processes=info.num_processes,
                                    global_devices=info.global_devices, local_devices=info.local_devices,
                                    data_hosts=data_hosts, rows=[rows.start, rows.stop], losses=losses,
                                    sampler=sampler_weights_check(trainer),
                                    lora_sampler=lora_sampler_check(mesh))),
        flush=True)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
