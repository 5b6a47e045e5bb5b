"""The stages of one run, resumable from its workdir.

    demos -> sft (warm start) -> value_pretrain -> rl -> eval

Every stage checkpoints its progress; the JSON record of the checkpoint says
which stages are done and how far the current one got, so relaunching the
same command continues where the last run stopped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from mtrl_jax import config as config_lib
from mtrl_jax.data import demos as demos_lib
from mtrl_jax.envs import registry as env_registry
from mtrl_jax.compile.counts import Laps
from mtrl_jax.compile.programs import Tree, shared
from mtrl_jax.metrics import MetricsWriter, Progress, say
from mtrl_jax.models import lora as lora_lib
from mtrl_jax.models.config import RUNTIME_FIELDS, ModelConfig
from mtrl_jax.models.tokenizer import ByteTokenizer, HFTokenizer
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.models.value import Critic, PolicyWithValueHead
from mtrl_jax.parallel.batch import num_batch_shards, put_global_batch
from mtrl_jax.parallel.device_split import SplitSamplerWeights, split_devices
from mtrl_jax.parallel.distributed import initialize_from_config
from mtrl_jax.parallel.host_exchange import allgather_objects, barrier, is_multihost
from mtrl_jax.parallel.mesh import mesh_from_config
from mtrl_jax.parallel.rules import rules_from_config
from mtrl_jax.parallel.sampler_mesh import SamplerWeights
from mtrl_jax.parallel.sharded_init import ModelOf, create_sharded
from mtrl_jax.parallel.sharded_step import join_trainable, sharding_context, split_trainable
from mtrl_jax.rollout.engine import RolloutEngine
from mtrl_jax.rollout.ownership import host_share
from mtrl_jax.sampling.sampler import Sampler, SamplingParams
from mtrl_jax.train import adapters, critic_bar, optim
from mtrl_jax.train.checkpoint import Checkpointer, abstract_like, read_meta, restore_subtree
from mtrl_jax.train.evaluate import evaluate, session_bar
from mtrl_jax.train.learner import Learner, NonFiniteError
from mtrl_jax.train.lm_step import LMStepProgram
from mtrl_jax.train.sft import DemoBatcher
from mtrl_jax.train.source import SyncSource, merge_host_infos


def _jsonable(c, model_cfg: ModelConfig | None = None) -> dict:
  out = json.loads(c.to_json_best_effort())
  if model_cfg is not None and c.hf_dir:
    # The model that ran (hf_dir's shape + our runtime switches), not config.model's byte-model defaults.
    out["model"] = {**dataclasses.asdict(model_cfg), "source": c.hf_dir}
  return out


def _pretrained_critic(source: str) -> bool:
  """Whether a warm-start workdir pretrained a separate critic: a run without one (critic.kind
  'none') also lists value_pretrain as done (a no-op stage) but has no critic to restore."""
  try:
    with open(os.path.join(source, "config.json")) as f:
      cfg = json.load(f)
  except (OSError, ValueError):
    return True  # no record of its config: try, and let the restore say what does not match
  return cfg.get("critic", {}).get("kind") == "separate" and cfg.get("value_pretrain", {}).get("enabled", True)


class Run:
  """Owns the mesh, models, learner, checkpointer and writers of one workdir."""

  def __init__(self, c, workdir: str):
    self.c, self.workdir = c, workdir
    self._compiles = Laps()  # what building the run compiles: its first lap, logged as "startup"
    self._evaluated = None  # (policy leaves, tasks, numbers) of the last evaluation (_done_eval)
    initialize_from_config(c.distributed)
    config_lib.validate(c)
    os.makedirs(workdir, exist_ok=True)
    # rollout.devices: the sampler gets the last devices, the learner's mesh the rest.
    self.split = split_devices(c.rollout.devices)
    self.mesh = mesh_from_config(c.mesh, None if self.split.shared else self.split.learner)
    self.rules = rules_from_config(c.mesh)
    self.is_main = jax.process_index() == 0
    self.tok = (HFTokenizer(os.path.expanduser(c.hf_dir), chat_template=c.chat.template or None,
                            prompt_role=c.chat.prompt_role) if c.hf_dir else ByteTokenizer())
    self.writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard, is_main_process=self.is_main)
    self.ckpt = Checkpointer(workdir, keep=c.checkpoint.keep, async_save=c.checkpoint.async_save)
    self.meta = self.ckpt.restore_meta() or {"stages_done": [], "stage": None, "stage_step": 0,
                                             "version": 0, "save_index": 0, "critic_ready": False}
    self._build_models()
    if self.ckpt.latest_step() is None and c.init_from:
      self._warm_start(c.init_from)
    elif self.ckpt.latest_step() is not None:
      if self.model_cfg.lora.enabled and c.init_from:
        self._set_base(self._source_policy(c.init_from)[0])  # LoRA checkpoints hold no base
      restored, _ = self.ckpt.restore(self._abstract_tree())
      self._load_tree(restored)
      say(f"resumed from checkpoint {self.ckpt.latest_step()} in {workdir}: stages done "
          f"{self.meta['stages_done']}, {self.meta['stage']} at step {self.meta['stage_step']}")
    if self.model_cfg.lora.enabled:
      record = adapters.base_record(c, self.learner.policy_params_for_sampler())
      if "lora_base" in self.meta:
        adapters.check_base(self.meta["lora_base"], record)
      self.meta["lora_base"] = record
    if self.is_main:
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(_jsonable(c, self.model_cfg), f, indent=1)

  # ---------------------------------------------------------------- models
  def _switches(self) -> dict:
    """The model's runtime fields (attention kernel, layout, remat, chunking) from config.model."""
    return {k: self.c.model[k] for k in RUNTIME_FIELDS}

  def _model_cfg(self) -> ModelConfig:
    if self.c.hf_dir:
      from mtrl_jax.models.hf import config_from_hf
      with open(os.path.join(self.c.hf_dir, "config.json")) as f:
        hf_cfg = config_from_hf(json.load(f), dtype=self.c.model.dtype)
      # How attention runs, how the blocks are laid out and rematerialised, how
      # log-probs are chunked: ours to choose, not the checkpoint's.
      return dataclasses.replace(hf_cfg, **self._switches())
    return ModelConfig.from_dict(self.c.model)

  def _build_models(self):
    c, mc = self.c, self._model_cfg()
    self.model_cfg = mc
    seed = c.seed
    if c.hf_dir:
      from mtrl_jax.models.hf import load_policy
      policy = load_policy(c.hf_dir, dtype=c.model.dtype, lora_seed=seed, **self._switches())
    else:
      # The seed is the init's argument: runs of other seeds share its compiled program.
      policy = create_sharded(ModelOf(Transformer, mc), self.mesh, self.rules, seed=seed)
    if c.critic.kind == "head":
      policy = PolicyWithValueHead(mc, rngs=nnx.Rngs(seed + 1), policy=policy)
    self.policy_gd, policy_params = nnx.split(policy)
    self.sampler_gd = nnx.split(policy.policy if c.critic.kind == "head" else policy)[0]
    critic_gd = critic_params = None
    if c.critic.kind == "separate":
      critic_mc = dataclasses.replace(mc, lora=lora_lib.OFF)
      critic = create_sharded(ModelOf(Critic, critic_mc), self.mesh, self.rules, seed=seed + 2)
      critic_gd, critic_params = nnx.split(critic)
    elif c.critic.kind == "lora":  # adapters + value head on the policy's trunk
      critic_gd, critic_params = adapters.shared_trunk_critic(c, mc, self.mesh, self.rules, seed + 2)
    self.critic_gd = critic_gd
    ref = policy_params if c.rl.kl_coef else None  # the learner keeps a copy
    self.learner = Learner(c, self.mesh, self.rules, policy_gd=self.policy_gd, policy_params=policy_params,
                           critic_gd=critic_gd, critic_params=critic_params, ref_params=ref,
                           total_updates=c.rl.steps, tokenizer=self.tok)
    self.learner.version = int(self.meta.get("version", 0))
    # Several hosts: every host samples on its own devices (parallel/sampler_mesh.py).
    # With rollout.devices, on its own devices (parallel/device_split.py).
    # With LoRA only the adapters move, then are merged or applied (train/adapters.py).
    sampler_gd, moving, finish = adapters.sampler_setup(mc, self.sampler_gd)
    if self.split.shared:
      self.weights = SamplerWeights(self.learner.policy_params_for_sampler(), self.rules,
                                    tuple(c.rollout.local_mesh), moving=moving, finish=finish)
    else:
      self.weights = SplitSamplerWeights(self.learner.policy_params_for_sampler(), self.rules,
                                         self.split.sampler, tuple(c.rollout.local_mesh), finish=finish)
    self.sampler = Sampler(sampler_gd, self.weights(self.learner.policy_params_for_sampler()),
                           pad_id=self.tok.pad_id, stop_ids=self.tok.stop_ids, version=self.learner.version,
                           mesh=None if self.split.shared else self.weights.mesh)

  def _source_policy(self, source: str):
    """(policy state, meta) of another run's latest checkpoint; with LoRA here, only its base part.

    A LoRA run's checkpoints hold adapters, not a base: point init_from at the
    full-weights run it started from instead.
    """
    if (read_meta(source) or {}).get("lora_base"):
      raise ValueError(f"config.init_from={source!r} is a LoRA run: its checkpoints hold adapters, not a "
                       f"policy; use the run (or hf_dir) its base came from")
    policy = self.learner.state.policy
    if self.model_cfg.lora.enabled:
      policy = split_trainable(policy, lora_lib.ADAPTER)[1]  # the base: the adapters start fresh
    try:
      got, meta = restore_subtree(source, {"policy": abstract_like(policy)})
    except (ValueError, KeyError) as e:  # orbax: a structure or shape that does not match
      raise ValueError(f"config.init_from={source!r}: its policy does not match this run's model "
                       f"(same config.model and critic.kind 'head' or not?): {e}") from e
    return got["policy"], meta

  def _set_base(self, base):
    """The policy's frozen base (the whole policy without LoRA) replaced."""
    st = self.learner.state
    if self.model_cfg.lora.enabled:
      base = join_trainable(split_trainable(st.policy, lora_lib.ADAPTER)[0], base)
    self.learner.state = st._replace(policy=base)

  def _warm_start(self, source: str):
    """The policy of another run's workdir (config.init_from) after its sft stage (with LoRA: the frozen base)."""
    got, meta = self._source_policy(source)
    source_done = list(meta.get("stages_done", []))
    done = [s for s in source_done if s in ("demos", "sft")]
    if "sft" not in done:
      raise ValueError(f"config.init_from={source!r}: that run has not finished its sft stage "
                       f"(stages done: {meta.get('stages_done')})")
    self._set_base(got)
    self._reset_policy_opt()
    if self.learner.ref_params is not None:
      self.learner.ref_params = self.learner.snapshot_ref()
    what = "policy"
    # A source that also finished value pretraining (a critic warm start shared by the critic
    # arms of a study): its critic too, when this run pretrains a separate critic of that shape.
    if ("value_pretrain" in source_done and "value_pretrain" in self.c.stages and self.c.value_pretrain.enabled
        and self.c.critic.kind == "separate" and _pretrained_critic(source)):
      try:
        crit, _ = restore_subtree(source, {"critic": abstract_like(self.learner.state.critic)})
      except (ValueError, KeyError) as e:
        raise ValueError(f"config.init_from={source!r}: its pretrained critic does not match this run's "
                         f"critic (same config.model, critic.kind 'separate'?): {e}") from e
      self.learner.state = self.learner.state._replace(critic=crit["critic"])
      self.meta["critic_ready"] = True
      if "critic_readout" in meta:  # how good it was when that run handed it on (the RL stage's warning)
        self.meta["critic_readout"] = meta["critic_readout"]
      done.append("value_pretrain")
      what = "policy and pretrained critic"
    self.meta["stages_done"] = done
    self._sync_sampler()
    say(f"warm start: {what} of {source} (stages {done} skipped here)")

  def _tree(self):
    s = self.learner.state
    # With LoRA the policy entry is its trainable part (adapters, a value head): the base
    # is named by meta["lora_base"] and rebuilt from there on resume.
    policy = split_trainable(s.policy, self.learner.policy_trainable)[0]
    return {"policy": policy, "opt_policy": s.opt_policy, "critic": s.critic, "opt_critic": s.opt_critic,
            "ref": self.learner.ref_params if self.learner.ref_params is not None else {}}

  def _abstract_tree(self):
    return abstract_like(self._tree())

  def _load_tree(self, t):
    from mtrl_jax.train.rl_step import LearnerState
    frozen = split_trainable(self.learner.state.policy, self.learner.policy_trainable)[1]
    self.learner.state = LearnerState(join_trainable(t["policy"], frozen), t["opt_policy"], t["critic"],
                                      t["opt_critic"])
    if self.learner.ref_params is not None:
      self.learner.ref_params = t["ref"]
    self.learner.version = int(self.meta.get("version", 0))

  def save(self, stage: str, stage_step: int):
    self.meta.update(stage=stage, stage_step=int(stage_step), version=self.learner.version,
                     config=_jsonable(self.c, self.model_cfg))
    self.meta["save_index"] = int(self.meta.get("save_index", 0)) + 1
    self.ckpt.save(self.meta["save_index"], self._tree(), dict(self.meta))

  def _finish_stage(self, stage: str):
    self.meta["stages_done"] = list(self.meta["stages_done"]) + [stage]
    self.save(stage, 0)

  # ---------------------------------------------------------------- rollout
  def _env_factory(self):
    name, kwargs = self.c.env.name, dict(self.c.env.kwargs)
    return lambda: env_registry.make(name, **kwargs)

  def _engine(self, group_size: int, sampling: SamplingParams, tree: bool = False) -> RolloutEngine:
    """The rollout engine; `tree=True` plays trees when config.rollout.tree.enabled."""
    r = self.c.rollout
    kw = dict(group_size=group_size, turn_token_budget=r.turn_budget, context_cap=r.context_cap,
              sampling=sampling, num_env_threads=r.env_threads, env_name=self.c.env.name)
    if tree and r.tree.enabled:
      from mtrl_jax.rollout.tree import TreeRolloutEngine, TreeSpec
      spec = TreeSpec(tuple(r.tree.branch_turns), r.tree.width, shared_draws=bool(r.tree.shared_draws))
      return TreeRolloutEngine(self.sampler, self.tok, self._env_factory(), tree=spec, **kw)
    if r.continuous:  # docs/rollout.md
      from mtrl_jax.rollout.continuous import ContinuousEngine
      return ContinuousEngine(self.sampler, self.tok, self._env_factory(), rows=r.rows, chunk=r.decode_chunk,
                              in_flight=r.in_flight, partial=r.partial, group_prefill=r.group_prefill, **kw)
    return RolloutEngine(self.sampler, self.tok, self._env_factory(), group_prefill=r.group_prefill, **kw)

  def _train_sampling(self) -> SamplingParams:
    r = self.c.rollout
    return SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)

  def _sync_sampler(self):
    """The learner's weights to this host's sampler (a global step on several hosts: all call it together)."""
    self.sampler.set_params(self.weights(self.learner.policy_params_for_sampler()), self.learner.version)

  def _share(self, tasks: int, field: str):
    """This host's block of an update's groups (all of them on one host)."""
    return host_share(tasks, field=field)

  def _everyone(self, sessions, info, stage: str, step: int):
    """All hosts' sessions of one update (canonical order) and their merged metrics.

    With config.log.sessions, each host first appends what it played to
    <workdir>/sessions/host<p>.jsonl.
    """
    if self.c.log.sessions:
      self._log_sessions(sessions, stage, step)
    if not is_multihost():
      return sessions, info
    everyone = allgather_objects((sessions, info))
    merged = sorted((s for ss, _ in everyone for s in ss), key=lambda s: (s.group_id, s.session_id))
    return merged, merge_host_infos([i for _, i in everyone], merged)

  def _log_sessions(self, sessions, stage: str, step: int):
    folder = os.path.join(self.workdir, "sessions")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"host{jax.process_index()}.jsonl"), "a") as f:
      for s in sessions:
        f.write(json.dumps({"stage": stage, "step": int(step), "host": jax.process_index(), **s.to_dict()},
                           default=float) + "\n")

  def evaluate(self, step: int, stage: str, tasks: int | None = None, write: bool = True) -> dict:
    c = self.c
    n = tasks or c.eval.tasks
    name = "eval" if stage == "eval" else f"{stage} eval"
    out = self._done_eval(n)
    if out is not None:
      say(f"{name}: this policy was evaluated on these {n} tasks already; its numbers are reused")
    else:
      self._sync_sampler()
      seeds = [c.eval.seed_offset + i for i in range(n)]
      sampled = self._engine(1, self._train_sampling())
      greedy = self._engine(1, SamplingParams(greedy=True)) if c.eval.greedy else None
      out = evaluate(sampled, greedy, seeds, jax.random.key(c.seed + 99),
                     share=host_share(len(seeds), allow_empty=True), decision_fn=self.learner.decision_fn,
                     progress=lambda which, k: session_bar(name if which == "sampled" else f"{name} {which}", k))
      self._evaluated = (self._policy_leaves(), n, out)
    if write:
      self.writer.write(step, stage, out)
    return out

  # ---------------------------------------------------------------- stages
  def run(self) -> dict:
    summary = {}
    try:
      self._log_compiles("startup")
      for stage in self.c.stages:
        if stage in self.meta["stages_done"]:
          say(f"stage {stage}: already done in {self.workdir}, skipping")
          continue
        t0 = time.time()
        say(f"stage {stage}: starting")
        out = getattr(self, f"stage_{stage}")() or {}
        summary.update(out)
        summary[f"time/{stage}_s"] = time.time() - t0
        self._log_compiles(stage)
        if stage != "demos":
          self._finish_stage(stage)
        else:
          self.meta["stages_done"] = list(self.meta["stages_done"]) + ["demos"]
      summary.update(self._compiles.total().as_metrics())  # the whole run
      if "critic" in summary:  # "critic below the bar: ..." (train/critic_bar.py's verdict)
        say(f"summary: {summary['critic']}")
    finally:
      self.ckpt.close()
      self.writer.close()
    return summary

  def _log_compiles(self, stage: str):
    """What `stage` compiled (console, and a metrics.jsonl record of stage "compile")."""
    d = self._compiles.lap()
    say(f"stage {stage}: compiling: {d.line()}")
    self.writer.write(self.learner.version, "compile", d.as_metrics(f"compile/{stage}/"))

  def demos_dir(self) -> str:
    return self.c.demos.data_dir or os.path.join(self.workdir, "demos")

  def _build_demos(self) -> str:
    """The demos dataset's folder; on several hosts the main process builds it first.

    The others then find it (a shared disk) or, on a host-local disk, build
    the same data themselves: it is a pure function of the config.
    """
    c = self.c

    def build():
      return demos_lib.build_demos(c.env.name, dict(c.env.kwargs), episodes=c.demos.episodes,
                                   data_dir=self.demos_dir(), quality=c.demos.quality, seed=c.seed)

    path = build() if self.is_main else None
    barrier("mtrl_jax.demos_built")
    return path if self.is_main else build()

  def stage_demos(self):
    path = self._build_demos()
    sessions = demos_lib.load_demos(path)
    stats = demos_lib.summarize(sessions)
    say(f"demos at {path}: {stats}")
    self.writer.write(0, "demos", {f"demos/{k}": v for k, v in stats.items()})
    return {f"demos/{k}": v for k, v in stats.items()}

  def stage_sft(self):
    c, s = self.c, self.c.sft
    path = self._build_demos()
    batcher = DemoBatcher(demos_lib.load_demos(path), self.tok, s.batch_size, c.seed,
                          only_successful=s.only_successful, pack=s.pack,
                          row_multiple=num_batch_shards(self.mesh, self.rules), context_cap=c.rollout.context_cap)
    tx = optim.adamw(s.lr, s.steps, warmup_steps=s.warmup_steps, weight_decay=s.weight_decay,
                     clip_grad=s.clip_grad)
    L = self.learner
    sampler_only = c.critic.kind == "head"
    gd = self.sampler_gd if sampler_only else self.policy_gd
    p_sh = L.state_sh.policy["policy"] if sampler_only else L.state_sh.policy
    from mtrl_jax.parallel.sharded_step import init_opt_state, opt_state_shardings
    params = L.state.policy["policy"] if sampler_only else L.state.policy
    # With LoRA only the adapters train (also here); `frozen` is the base.
    params, frozen = split_trainable(params, L.policy_trainable)
    p_sh, frozen_sh = split_trainable(p_sh, L.policy_trainable)
    o_sh = opt_state_shardings(tx, params, p_sh, self.mesh)
    start = int(self.meta["stage_step"]) if self.meta.get("stage") == "sft" else 0
    opt = init_opt_state(tx, params, o_sh)
    if start and not sampler_only:
      opt = L.state.opt_policy  # resumed mid-stage: the optimiser moments were saved there
    # Shared by every run of this process with an equal spec (mtrl_jax/compile/programs.py).
    step_fn = shared(LMStepProgram(gd, tx, self.mesh, tuple(self.rules), Tree(p_sh), Tree(o_sh), Tree(frozen_sh)))
    lora_args = () if frozen is None else (frozen,)
    prog = Progress("sft", s.steps, start)
    for k in range(start, s.steps):
      # Every host builds the same global batch and feeds its own devices' rows.
      batch = put_global_batch(batcher.batch(k), self.mesh, self.rules)
      params, opt, met = step_fn(params, opt, batch, *lora_args)
      if (k + 1) % max(c.log.every * 10, 1) == 0 or k + 1 == s.steps:
        m = jax.device_get(met)
        if not np.isfinite(m["loss"]):
          raise NonFiniteError(f"sft step {k}: non-finite loss; lower config.sft.lr")
        self.writer.write(k + 1, "sft", {**{f"sft/{n}": v for n, v in m.items()},
                                         "sft/pad_fraction": batcher.pad_fraction(k)})
        prog.update(k + 1, loss=float(m["loss"]), acc=float(m["accuracy"]))
      self._set_policy(join_trainable(params, frozen), sampler_only, opt)
      if (k + 1) % max(c.checkpoint.every * 10, 1) == 0 and k + 1 < s.steps:
        self.save("sft", k + 1)
    self._set_policy(join_trainable(params, frozen), sampler_only, None)
    # The optimiser state of the RL stage starts fresh.
    self._reset_policy_opt()
    if self.learner.ref_params is not None:
      self.learner.ref_params = self.learner.snapshot_ref()
    return self.evaluate(s.steps, "sft")

  def _policy_leaves(self) -> list:
    """The policy's parameter arrays, by identity: jax arrays are immutable, so the same objects are
    the same policy (a critic-head run swaps them inside the policy dict, which a check of the dict
    alone would miss)."""
    return jax.tree.leaves(self.learner.state.policy)

  def _done_eval(self, tasks: int) -> dict | None:
    """The last evaluation's numbers when it played these `tasks` with the policy as it is now: RL's
    step 0 after SFT, and the final stage after RL's last update, are the same policy on the same
    held-out tasks with the same key, and a real model's evaluation on a CPU takes tens of minutes."""
    if self._evaluated is None:
      return None
    leaves, n, out = self._evaluated
    now = self._policy_leaves()
    same = n == tasks and len(now) == len(leaves) and all(a is b for a, b in zip(now, leaves))
    return out if same else None

  def _set_policy(self, params, sampler_only, opt):
    st = self.learner.state
    if sampler_only:
      st.policy["policy"] = params
      self.learner.state = st._replace(policy=st.policy)
    else:
      self.learner.state = st._replace(policy=params, opt_policy=opt if opt is not None else st.opt_policy)

  def _reset_policy_opt(self):
    L = self.learner
    L.state = L.state._replace(opt_policy=L.fresh_policy_opt())

  def _init_critic_from_policy(self):
    if self.meta.get("critic_ready") or self.c.critic.kind != "separate" or not self.c.critic.init_from_policy:
      return
    L = self.learner
    pol = nnx.to_flat_state(lora_lib.merged(L.state.policy, self.model_cfg.lora))  # a LoRA policy: merged
    src = {p: v for p, v in pol}
    crit = L.state.critic
    flat = []
    for path, var in nnx.to_flat_state(crit):
      if path[0] == "trunk" and path[1:] in src:
        var = var.replace(jnp.array(src[path[1:]].get_value()))
      flat.append((path, var))
    L.state = L.state._replace(critic=nnx.from_flat_state(flat))
    self.meta["critic_ready"] = True

  def stage_value_pretrain(self):
    if not self.c.value_pretrain.enabled or self.c.critic.kind == "none":
      return {}
    self._init_critic_from_policy()
    from mtrl_jax.train import value_pretrain
    return value_pretrain.stage(self)

  def stage_rl(self):
    c, rl = self.c, self.c.rl
    self._init_critic_from_policy()
    critic = self._critic_check()
    start = int(self.meta["stage_step"]) if self.meta.get("stage") == "rl" else 0
    engine = self._engine(rl.group_size, self._train_sampling(), tree=True)
    budget = float(c.rollout.tree.token_budget)
    share = self._share(rl.tasks_per_update, "rl.tasks_per_update")
    if c.asynchronous.enabled:
      from mtrl_jax.train.async_source import AsyncSource
      a = c.asynchronous
      source = AsyncSource(engine, params=self.weights(self.learner.policy_params_for_sampler()),
                           version=self.learner.version, seed=c.seed, tasks_per_update=rl.tasks_per_update,
                           eta=a.eta, actors=a.actors, start_step=start, groups_per_chunk=a.groups_per_chunk,
                           step_timeout_s=a.step_timeout_s or None, share=share)
    else:
      source = SyncSource(engine, seed=c.seed, tasks_per_update=rl.tasks_per_update,
                          dynamic_sampling=rl.dynamic_sampling, max_resample_rounds=rl.max_resample_rounds,
                          share=share, progress=None if c.rollout.tree.enabled else session_bar)
    prog = Progress("rl", rl.steps, start)
    nan_at = set(int(x) for x in c.debug.nan_at_updates)
    last = {}
    tokens_seen = float(self.meta.get("tokens_seen", 0.0))
    step = start
    try:
      if start == 0:
        self.evaluate(0, "rl")  # the warm-started policy: the baseline of the curve
      for step in range(start, rl.steps):
        if budget and tokens_seen >= budget:
          say(f"rl: token budget {budget:.0f} spent after {step} updates ({tokens_seen:.0f} tokens)")
          if step > start and not any(k.startswith("eval/") for k in last):
            last = self.writer.write(step, "rl", self.evaluate(step, "rl", write=False))
          break
        t0 = time.time()
        if c.asynchronous.enabled:  # a copy: the learner's step donates its buffers
          source.publish(self.weights(self.learner.policy_params_for_sampler()), self.learner.version)
        else:
          self._sync_sampler()
        sessions, info = self._everyone(*source.next_batch(step), "rl", step)
        met = self.learner.update(sessions, step, train_policy=step >= rl.critic_warmup,
                                  poison=float("nan") if step in nan_at else 0.0)
        tokens_seen += info.get("ledger/tokens_generated", 0.0) + info.get("ledger/tokens_prefilled", 0.0)
        rec = {**info, **met, "tokens_seen": tokens_seen, "time/step_s": time.time() - t0,
               "policy_version": self.learner.version}
        if (step + 1) % c.eval.every == 0 or step + 1 == rl.steps:
          rec.update(self.evaluate(step + 1, "rl", write=False))
        last = self.writer.write(step + 1, "rl", rec)
        prog.update(step + 1, ret=info["rollout/return"], succ=info["rollout/success"],
                    **({"eval": rec["eval/success"]} if "eval/success" in rec else {}))
        self.meta["tokens_seen"] = tokens_seen
        if (step + 1) % c.checkpoint.every == 0 and step + 1 < rl.steps:
          self.save("rl", step + 1)
    except NonFiniteError:
      self.save("rl", step)  # the last good state, so the run can be inspected or resumed
      raise
    finally:
      source.close()
    return {**{k: v for k, v in last.items() if k.startswith("eval/")}, **critic}

  def _critic_check(self) -> dict:
    """The RL stage's word on its critic (critic_bar.rl_warning): a warning when an estimator that
    bootstraps from it starts with a critic below the bar, unjudged or not pretrained; the
    verdict goes into the run's summary."""
    c = self.c
    if c.critic.kind == "none":
      return {}
    pretrained = "value_pretrain" in self.meta["stages_done"] and c.value_pretrain.enabled
    readout = self.meta.get("critic_readout") if pretrained else None
    warning = critic_bar.rl_warning(c.rl.estimator, readout, pretrained)
    if warning:
      logging.warning("%s", warning)
      say(f"WARNING: {warning}")
    return {"critic": critic_bar.verdict(readout) if readout else "critic not pretrained" if not pretrained
            else "critic bar not judged: no readout"}

  def stage_eval(self):
    out = self.evaluate(self.c.rl.steps, "eval", tasks=max(self.c.eval.tasks, 64))
    say(f"final evaluation: {out}")
    return {f"final/{k}": v for k, v in out.items()}
