"""Shared config pieces and their validation.

Experiment files in `configs/` start from `base_config()` and change what
they need. `validate()` runs before any compute and names the bad field.
"""
from __future__ import annotations

import ml_collections

STAGES = ("demos", "sft", "value_pretrain", "rl", "eval")
LAYOUTS = ("session", "turn")
CONTEXTS = ("history", "markov")
CRITIC_KINDS = ("none", "separate", "head")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_TYPES = ("k1", "k3")
KL_MODES = ("loss", "reward")
AAW_ESTIMATORS = ("grpo", "ms_grpo")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.stages = STAGES  # which stages run, in this order

  # A tiny byte-level decoder: runs on a CPU laptop in minutes.
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=264, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=192,
      rope_theta=10_000.0, norm_eps=1e-6, qkv_bias=False, tie_embeddings=True,
      dtype="float32", param_dtype="float32",
      attention="auto",  # training-path kernel: auto | xla | cudnn | splash | blockwise
      attention_block=512,
      scan_layers=False,  # stack the blocks and scan them: compile time flat in depth
      remat="none",  # none | full | dots | dots_no_batch (see models/config.py)
      logits_chunk=0,  # > 0: the learner's log-probs in chunks of this many positions (memory)
  ))
  c.hf_dir = ""  # a local HF folder (Llama/Qwen2) to start the policy from instead
  # A warm start shared by many runs (a study's cells): another run's workdir whose
  # policy (after its `sft` stage) starts this run when it has no checkpoint of its own;
  # the stages that run finished up to sft (demos, sft) are then skipped here.
  c.init_from = ""
  c.critic = ml_collections.ConfigDict(dict(
      kind="separate",  # none | separate (own trunk) | head (value head on the policy trunk)
      init_from_policy=True,
  ))

  # The learned progress head of rl.estimator='progress' (SPA-RL; train/progress.py): AdamW steps
  # on each RL update's sessions before their advantages are computed.
  c.progress = ml_collections.ConfigDict(dict(steps=20, lr=1e-3))

  c.env = ml_collections.ConfigDict(dict(name="memory", kwargs=ml_collections.ConfigDict()))

  c.demos = ml_collections.ConfigDict(dict(
      episodes=1000, quality=0.5, data_dir="",  # "" = <workdir>/demos
  ))

  c.sft = ml_collections.ConfigDict(dict(
      steps=300, batch_size=32, lr=3e-3, warmup_steps=20, weight_decay=0.0, clip_grad=1.0,
      only_successful=False,
      pack=False,  # several demos per row (attention kept inside each demo)
  ))

  c.value_pretrain = ml_collections.ConfigDict(dict(
      enabled=True, rounds=20, tasks_per_round=8, epochs=4,  # the critic's optimiser is rl.critic_lr
      patience=3,  # rounds without explained-variance improvement before stopping
      min_delta=0.005,
  ))

  c.rollout = ml_collections.ConfigDict(dict(
      turn_budget=16,  # new tokens per turn; a turn that hits it is cut
      context_cap=512,  # KV-cache capacity per session; a session that would exceed it ends
      temperature=1.0, top_k=0, top_p=1.0, env_threads=4,
      # Several hosts: each samples on a mesh of its own devices (parallel/sampler_mesh.py);
      # () = (local devices, 1, 1), or tensor-split when the weights do not fit one device.
      local_mesh=(),
  ))
  # Tree rollouts (rollout/tree.py, docs/trees.md): in the RL stage every live session forks into
  # `width` siblings at each turn of `branch_turns`; rl.group_size counts leaves (a multiple of
  # width ** len(branch_turns)). token_budget > 0 ends the RL stage once that many generated +
  # prefilled tokens were spent (chains too, so trees and chains compare at equal tokens).
  c.rollout.tree = ml_collections.ConfigDict(dict(enabled=False, branch_turns=(), width=2, token_budget=0))

  c.rl = ml_collections.ConfigDict(dict(
      steps=100,
      tasks_per_update=8,  # B tasks ...
      group_size=8,  # ... x G sessions each
      estimator="ms_grpo",
      estimator_kwargs=ml_collections.ConfigDict(),
      layout="session",  # session | turn (one sample per turn)
      context="history",  # history | markov (turn layout only)
      epochs=1, minibatches=2,
      lr=1e-3, warmup_steps=5, weight_decay=0.0, clip_grad=1.0, critic_lr=1e-3,
      eps_low=0.2, eps_high=0.28, dual_clip=0.0,  # 0 = off
      aggregation="token_mean",
      decoupled=True, is_cap=5.0,  # decoupled PPO (AReaL): mask tokens with w > is_cap
      kl_coef=0.0, kl_type="k3", kl_mode="loss",
      entropy_coef=0.0, entropy_mask_rho=1.0,  # 1.0 = all tokens; 0.2 = forking tokens only
      value_coef=0.5, value_clip=0.2, critic_warmup=0,
      nll_coef=0.0,  # VAPO NLL on successful sessions
      dynamic_sampling=False, max_resample_rounds=2,
      overlong_buffer=0, overlong_factor=1.0,  # 0 = no overlong shaping
      max_nonfinite=3,  # stop after this many non-finite updates in a row
      # Several sessions per row in the learner (first fit, longest first; attention
      # kept inside each session): fewer padded tokens when lengths differ a lot.
      pack=False,
      pack_len=0,  # packed row length; 0 = the batch's longest sample (bucketed). With
      # seq_mean_token_sum and no norm_len, the divisor is the packed row length.
      # Absolute-advantage-weighted episode sampling (MS-GRPO): train on
      # round(aaw_fraction x episodes) episodes drawn with p ~ |A| + aaw_floor.
      aaw=False, aaw_fraction=0.5, aaw_floor=0.0,
  ))

  # eval/success samples at the rollout temperature; greedy=True adds eval/greedy_*.
  c.eval = ml_collections.ConfigDict(dict(every=10, tasks=32, seed_offset=1_000_000, greedy=True))
  c.checkpoint = ml_collections.ConfigDict(dict(every=10, keep=2, async_save=True))
  from mtrl_jax.parallel.mesh import default_mesh_config
  c.mesh = default_mesh_config()  # shape (-1,1,1) = pure data parallel; rules preset "default" | "fsdp"
  # sessions=True: every host appends the sessions it played (RL and value pretraining) to
  # <workdir>/sessions/host<p>.jsonl, one JSON record per session with its update.
  c.log = ml_collections.ConfigDict(dict(every=1, tensorboard=True, sessions=False))
  # Async actors (AReaL-style): eta bounds staleness in policy versions; 0 = synchronous.
  c.asynchronous = ml_collections.ConfigDict(dict(
      enabled=False, eta=1, actors=4, groups_per_chunk=1,
      step_timeout_s=0.0,  # > 0: an env step slower than this ends its session as env_error
  ))
  from mtrl_jax.parallel.distributed import default_distributed_config
  c.distributed = default_distributed_config()  # unset fields fall back to MTRL_* env vars / jax auto-detect
  c.debug = ml_collections.ConfigDict(dict(nan_at_updates=()))
  return c


def _check(cond: bool, field: str, msg: str):
  if not cond:
    raise ValueError(f"config.{field}: {msg}")


def _positive(c, *fields):
  for f in fields:
    node = c
    for part in f.split("."):
      node = node[part]
    _check(node > 0, f, f"must be positive, got {node!r}")


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ValueError naming the first bad field; runs before any compute."""
  from mtrl_jax.models.config import ModelConfig
  try:
    ModelConfig.from_dict(c.model)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model: {e}") from e
  for s in c.stages:
    _check(s in STAGES, "stages", f"unknown stage {s!r}; known: {STAGES}")
  _positive(c, "rl.tasks_per_update", "rl.group_size", "rl.epochs", "rl.minibatches",
            "rollout.turn_budget", "rollout.context_cap", "sft.batch_size", "eval.tasks")
  _check(c.rl.steps >= 0, "rl.steps", f"must be >= 0, got {c.rl.steps}")
  _check(c.rl.layout in LAYOUTS, "rl.layout", f"{c.rl.layout!r} not in {LAYOUTS}")
  _check(c.rl.pack_len >= 0, "rl.pack_len", f"must be >= 0 (0 = the batch's longest sample), got {c.rl.pack_len}")
  _check(c.rl.context in CONTEXTS, "rl.context", f"{c.rl.context!r} not in {CONTEXTS}")
  _check(c.rl.aggregation in AGGREGATIONS, "rl.aggregation", f"{c.rl.aggregation!r} not in {AGGREGATIONS}")
  _check(c.rl.kl_type in KL_TYPES, "rl.kl_type", f"{c.rl.kl_type!r} not in {KL_TYPES}")
  _check(c.rl.kl_mode in KL_MODES, "rl.kl_mode", f"{c.rl.kl_mode!r} not in {KL_MODES}")
  _check(c.critic.kind in CRITIC_KINDS, "critic.kind", f"{c.critic.kind!r} not in {CRITIC_KINDS}")
  _check(0.0 < c.rl.entropy_mask_rho <= 1.0, "rl.entropy_mask_rho", "must be in (0, 1]")
  _check(isinstance(c.rl.aaw, bool), "rl.aaw", f"must be True or False, got {c.rl.aaw!r}")
  _check(0.0 < c.rl.aaw_fraction <= 1.0, "rl.aaw_fraction",
         f"the fraction of episodes AAW keeps must be in (0, 1], got {c.rl.aaw_fraction!r}")
  _check(c.rl.aaw_floor >= 0.0, "rl.aaw_floor", f"must be >= 0, got {c.rl.aaw_floor!r}")
  _check(not (c.rl.aaw and c.rl.pack), "rl.aaw",
         "AAW draws whole one-session rows; set rl.pack=False to use it")
  _check(not c.rl.aaw or c.rl.estimator in AAW_ESTIMATORS, "rl.aaw",
         f"AAW weighs episodes by the outcome advantage; it needs rl.estimator in {AAW_ESTIMATORS}, "
         f"got {c.rl.estimator!r}")
  _check(0.0 <= c.demos.quality <= 1.0, "demos.quality", f"must be in [0, 1], got {c.demos.quality}")
  _check(c.rollout.temperature > 0, "rollout.temperature", "must be > 0 (use eval greedy for argmax)")
  if c.rollout.tree.enabled:
    from mtrl_jax.rollout.tree import TreeSpec
    try:
      TreeSpec(tuple(c.rollout.tree.branch_turns), c.rollout.tree.width).roots(c.rl.group_size)
    except ValueError as e:
      raise ValueError(f"config.rollout.tree: {e}") from e
  _check(c.rollout.tree.token_budget >= 0, "rollout.tree.token_budget", "must be >= 0 (0 = no limit)")
  _check(len(tuple(c.rollout.local_mesh)) in (0, 3), "rollout.local_mesh",
         f"must be () (automatic) or a (data, fsdp, tensor) shape, got {tuple(c.rollout.local_mesh)}")
  import jax
  hosts = jax.process_count()
  for f in ("rl.tasks_per_update", "value_pretrain.tasks_per_round"):
    n = c.rl.tasks_per_update if f.startswith("rl") else c.value_pretrain.tasks_per_round
    _check(n >= hosts, f, f"{n} groups cannot be shared by {hosts} processes (each plays whole groups); "
           f"use at least {hosts}, ideally a multiple")
  _check(c.asynchronous.eta >= 0, "asynchronous.eta", f"must be >= 0, got {c.asynchronous.eta}")
  _check(c.asynchronous.actors >= 1, "asynchronous.actors", f"must be >= 1, got {c.asynchronous.actors}")

  from mtrl_jax.credit import registry as credit_registry
  names = credit_registry.estimator_names()
  _check(c.rl.estimator in names, "rl.estimator", f"unknown estimator {c.rl.estimator!r}; known: {sorted(names)}")
  valid_hp = credit_registry.hparam_defaults(c.rl.estimator)
  for k in c.rl.estimator_kwargs:
    _check(k in valid_hp, f"rl.estimator_kwargs.{k}",
           f"not a hyper-parameter of {c.rl.estimator!r}; valid: {sorted(valid_hp)}")
  if c.rl.estimator == "progress":
    _positive(c, "progress.steps", "progress.lr")
  needs_critic = c.rl.estimator in ("gae", "turn_gae", "bilevel_gae")
  _check(not needs_critic or c.critic.kind != "none", "critic.kind",
         f"estimator {c.rl.estimator!r} needs a critic; set critic.kind to separate or head")

  from mtrl_jax.envs import registry as env_registry
  _check(c.env.name in env_registry.names(), "env.name",
         f"unknown environment {c.env.name!r}; known: {sorted(env_registry.names())}")
  try:
    env_registry.make(c.env.name, **dict(c.env.kwargs))
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.env.kwargs: {e}") from e

  _validate_mesh(c, num_devices)


def _validate_mesh(c, num_devices):
  import numpy as np
  if num_devices is None:
    import jax
    num_devices = jax.device_count()
  from mtrl_jax.parallel.mesh import resolve_mesh_shape
  from mtrl_jax.parallel.rules import rules_from_config
  full = resolve_mesh_shape(tuple(c.mesh.shape), num_devices, field="config.mesh.shape")
  rules_from_config(c.mesh)
  batch_axes = full[0] * full[1]
  sessions = c.rl.tasks_per_update * c.rl.group_size
  _check(sessions % c.rl.minibatches == 0, "rl.minibatches",
         f"{sessions} sessions per update (tasks_per_update x group_size) do not divide into "
         f"{c.rl.minibatches} minibatches")
  if c.rl.layout == "session":
    per_mb = sessions // c.rl.minibatches
    _check(per_mb % batch_axes == 0, "rl.minibatches",
           f"a minibatch of {per_mb} sessions is not divisible by the data x fsdp mesh axes "
           f"({full[0]} x {full[1]} = {batch_axes})")
  _check(c.sft.batch_size % batch_axes == 0, "sft.batch_size",
         f"{c.sft.batch_size} is not divisible by the data x fsdp mesh axes ({batch_axes})")
