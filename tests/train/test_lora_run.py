"""LoRA in a run: checkpoints hold the adapters and name the base, resume restores them exactly."""
import os
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from main_helpers import ROOT, env_one_device, main_cmd, run_main, shared_compile_cache
from mtrl_jax.metrics import read_metrics
from mtrl_jax.models import lora
from mtrl_jax.train.run import Run
from tiny_world import host, tiny_config

LORA_ARGS = ["--config.model.lora.rank=4", "--config.model.lora.alpha=8.0"]


def lora_run_config():
  c = tiny_config("lora", estimator="gae", kl_coef=0.05)
  c.model.lora.update(rank=4, alpha=8.0)
  c.checkpoint.async_save = False
  c.log.tensorboard = False
  return c


def perturbed(tree, seed):
  """Every float leaf moved by noise: restored values then cannot pass by being the initial ones."""
  rng = np.random.default_rng(seed)

  def one(x):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
      return jnp.asarray(x)
    return jnp.asarray(x + 0.01 * rng.standard_normal(x.shape).astype(x.dtype))

  return jax.tree.map(one, host(tree))


def raw_checkpoint(workdir):
  mgr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  out = mgr.restore(mgr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                               meta=ocp.args.JsonRestore()))
  mgr.close()
  return out.state, out.meta


def nbytes(tree) -> int:
  return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


def test_checkpoint_holds_adapters_names_the_base_and_resume_restores_them(tmp_path):
  """Saved: the policy entry is its adapters only (their bytes exactly), the
  critic entry the shared-trunk critic's adapters and head, the reference its
  adapters; meta["lora_base"] names the seed's base. Resumed: the policy's
  base is rebuilt equal, and adapters, critic, optimiser moments and reference
  come back bit for bit (they were all moved off their initial values first).
  A resume onto another base (another seed) is refused, naming config.seed.

  Break checked: _tree saving the whole policy fails the bytes assertion;
  _load_tree dropping the restored adapters (keeping the fresh ones) fails
  the equality; check_base skipped lets the other seed resume.
  """
  wd = str(tmp_path / "run")
  c = lora_run_config()
  run = Run(c, wd)
  L = run.learner
  adapters0, base0 = nnx.split_state(L.state.policy, lora.ADAPTER, ...)
  L.state = L.state._replace(policy=nnx.merge_state(perturbed(adapters0, 1), base0),
                             opt_policy=perturbed(L.state.opt_policy, 2), critic=perturbed(L.state.critic, 3),
                             opt_critic=perturbed(L.state.opt_critic, 4))
  L.ref_params = perturbed(L.ref_params, 5)
  want = host({"policy": L.state.policy, "opt_policy": L.state.opt_policy, "critic": L.state.critic,
               "opt_critic": L.state.opt_critic, "ref": L.ref_params})
  run.save("rl", 1)
  run.ckpt.close()

  saved, meta = raw_checkpoint(wd)
  policy_adapters = lora.adapters(want["policy"])
  assert nbytes(saved["policy"]) == nbytes(policy_adapters) < nbytes(want["policy"]) / 4
  assert nbytes(saved["ref"]) == nbytes(policy_adapters)
  assert nbytes(saved["critic"]) == nbytes(want["critic"])
  assert meta["lora_base"]["kind"] == "seed" and meta["lora_base"]["seed"] == c.seed
  assert meta["lora_base"]["params"] == sum(np.size(x) for x in jax.tree.leaves(lora.base(want["policy"])))

  resumed = Run(lora_run_config(), wd)
  L2 = resumed.learner
  got = host({"policy": L2.state.policy, "opt_policy": L2.state.opt_policy, "critic": L2.state.critic,
              "opt_critic": L2.state.opt_critic, "ref": L2.ref_params})
  resumed.ckpt.close()
  for name in want:
    a, b = jax.tree.leaves(want[name]), jax.tree.leaves(got[name])
    assert len(a) == len(b) and len(a) > 0, name
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y, err_msg=name)

  other = lora_run_config()
  other.seed = 1
  with pytest.raises(ValueError, match="config.seed"):
    Run(other, wd)


def test_sft_stage_trains_only_the_adapters(tmp_path):
  """Behaviour cloning with LoRA on: the base leaves the stage bit-identical,
  the adapters move, and the RL optimiser starts fresh over the adapters only.

  Break checked: run.stage_sft without the split (split_trainable(params,
  None)) trains the base: the base assertion fails.
  """
  c = lora_run_config()
  c.update(stages=("demos", "sft"))
  c.sft.update(steps=3, batch_size=8, lr=1e-2, warmup_steps=0)
  c.demos.episodes = 16
  c.eval.update(tasks=2, greedy=False)
  run = Run(c, str(tmp_path / "sft"))
  ad0, base0 = (host(x) for x in nnx.split_state(run.learner.state.policy, lora.ADAPTER, ...))
  run.stage_sft()
  ad1, base1 = (host(x) for x in nnx.split_state(run.learner.state.policy, lora.ADAPTER, ...))
  run.ckpt.close()
  for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(base1)):
    np.testing.assert_array_equal(a, b)
  assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(ad0), jax.tree.leaves(ad1))) > 5e-3
  opt_elems = sum(np.size(x) for x in jax.tree.leaves(run.learner.state.opt_policy) if np.ndim(x) > 0)
  assert opt_elems == 2 * sum(np.size(x) for x in jax.tree.leaves(ad1))


@pytest.mark.slow
def test_lora_kill_and_resume_matches_uninterrupted_run(tmp_path):
  """The main job with LoRA adapters (and a shared-trunk critic), killed after
  RL update 2 and relaunched, ends with the same adapters, critic and
  optimiser state as an uninterrupted run, bit for bit; its checkpoints hold
  no base weights."""
  extra = [*LORA_ARGS, "--config.critic.kind=lora", "--config.rl.estimator=gae",
           "--config.rl.steps=5", "--config.eval.every=100", "--config.checkpoint.async_save=false",
           "--config.value_pretrain.enabled=false", shared_compile_cache(tmp_path / "jax_cache")]
  ref_dir, kill_dir = str(tmp_path / "ref"), str(tmp_path / "killed")
  ref = run_main(ref_dir, *extra, timeout=600)
  assert ref.returncode == 0, ref.stderr[-3000:]

  proc = subprocess.Popen(main_cmd(kill_dir, *extra), cwd=ROOT, env=env_one_device(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 400
  killed_at = None
  while time.time() < deadline and proc.poll() is None:
    rl = [r["step"] for r in read_metrics(kill_dir) if r["stage"] == "rl" and "ledger/tokens_generated" in r]
    if rl and max(rl) >= 2:
      proc.send_signal(signal.SIGKILL)
      killed_at = max(rl)
      break
    time.sleep(0.2)
  proc.wait(timeout=30)
  assert killed_at is not None, "the run ended or stalled before reaching RL step 2"
  resumed = run_main(kill_dir, *extra, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from checkpoint" in resumed.stderr
  a, meta_a = raw_checkpoint(ref_dir)
  b, _ = raw_checkpoint(kill_dir)
  la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))
  policy_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(a["policy"])]
  assert policy_paths and all("_lora_" in p for p in policy_paths)
  assert meta_a["lora_base"]["kind"] == "seed"


def test_init_from_a_full_run_is_the_base_and_resume_reads_it_there(tmp_path):
  """With init_from, a LoRA run's base is the source run's policy (bit for bit)
  and its adapters start fresh; resumed, it reads the base from the source
  again (its own checkpoints hold none) and its adapters from its checkpoint.
  A source whose policy changed since is refused, and so is a LoRA run as a
  source (it has no base to give).

  Break checked: the resume without re-reading the base from init_from keeps
  the seed's random base (the base assertion after resume fails, and the
  fingerprint check raises first).
  """
  src, wd = str(tmp_path / "src"), str(tmp_path / "lora")
  c_src = tiny_config("none")
  c_src.checkpoint.async_save = False
  c_src.log.tensorboard = False
  source = Run(c_src, src)
  source.learner.state = source.learner.state._replace(policy=perturbed(source.learner.state.policy, 7))
  source.meta["stages_done"] = ["demos", "sft"]
  source.save("sft", 0)
  want_base = host(source.learner.state.policy)
  source.ckpt.close()

  c = lora_run_config()
  c.critic.kind = "none"
  c.rl.estimator = "ms_grpo"
  c.init_from = src
  run = Run(c, wd)
  assert run.meta["lora_base"]["kind"] == "init_from" and run.meta["stages_done"] == ["demos", "sft"]
  ad, base = nnx.split_state(run.learner.state.policy, lora.ADAPTER, ...)
  for a, b in zip(jax.tree.leaves(want_base), jax.tree.leaves(host(base))):
    np.testing.assert_array_equal(a, b)
  assert all(not np.any(np.asarray(x)) for p, x in jax.tree_util.tree_leaves_with_path(ad)
             if "_lora_b" in jax.tree_util.keystr(p))
  run.learner.state = run.learner.state._replace(policy=nnx.merge_state(perturbed(ad, 8), base))
  want_ad = host(nnx.split_state(run.learner.state.policy, lora.ADAPTER, ...)[0])
  run.save("rl", 1)
  run.ckpt.close()

  resumed = Run(c, wd)
  ad2, base2 = (host(x) for x in nnx.split_state(resumed.learner.state.policy, lora.ADAPTER, ...))
  resumed.ckpt.close()
  for a, b in zip(jax.tree.leaves(want_base) + jax.tree.leaves(want_ad),
                  jax.tree.leaves(base2) + jax.tree.leaves(ad2)):
    np.testing.assert_array_equal(a, b)

  source = Run(c_src, src)  # the source moves on: its policy is no longer the adapters' base
  source.learner.state = source.learner.state._replace(policy=perturbed(source.learner.state.policy, 9))
  source.save("sft", 0)
  source.ckpt.close()
  with pytest.raises(ValueError, match="changed since"):
    Run(c, wd)

  c2 = lora_run_config()
  c2.init_from = wd
  with pytest.raises(ValueError, match="config.init_from=.* is a LoRA run"):
    Run(c2, str(tmp_path / "third"))
