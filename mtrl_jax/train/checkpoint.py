"""Orbax checkpoints of everything a run needs to resume exactly.

One manager per workdir. Each save holds the array state (policy, critic,
reference, optimiser states) and a JSON record (stages done, current stage
and step, policy version, the config), so a relaunch of the same command
continues where the last save left off, on the same or a different mesh.

No RNG state or data cursor needs saving: every random draw of a run (task
seeds, rollout keys, minibatch order, demo batches) is a pure function of
(config.seed, stage, step), so the step in the JSON record is the data
position and the key at once. That is what makes a resumed run end with
bit-identical parameters (tests/train/test_main_e2e.py).
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging


class Checkpointer:

  def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                             create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict, *, force: bool = True) -> None:
    """Saves asynchronously; the previous save is finished first by orbax."""
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
    logging.info("checkpoint %d queued (%s)", step, meta.get("stage"))

  def restore_meta(self, step: int | None = None) -> dict | None:
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(out.meta)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
    """Restores onto the shardings named by `abstract_state`'s leaves.

    `abstract_state` leaves are `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`;
    a different mesh than the one saved from reshards on the fly.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return out.state, dict(out.meta)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) matching a live pytree of arrays."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def restore_subtree(workdir: str, abstract_subtree: dict) -> tuple[dict, dict]:
  """Some top-level entries (e.g. {"policy": ...}) of another run's latest checkpoint, and its meta.

  For a warm start shared by many runs (`config.init_from`): the source run may
  differ in everything but the entries restored (a critic of another kind, no
  reference model), so only those are read (orbax partial restore).
  """
  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))
  step = manager.latest_step()
  if step is None:
    raise FileNotFoundError(f"config.init_from: no checkpoint in {directory}")
  restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_subtree)
  out = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(item=abstract_subtree, restore_args=restore_args, partial_restore=True),
      meta=ocp.args.JsonRestore()))
  manager.close()
  return out.state, dict(out.meta)


def read_meta(workdir: str) -> dict | None:
  """The JSON record of another run's latest checkpoint (None when it has none)."""
  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  if not os.path.isdir(directory):
    return None
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))
  try:
    step = manager.latest_step()
    if step is None:
      return None
    return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
  finally:
    manager.close()
