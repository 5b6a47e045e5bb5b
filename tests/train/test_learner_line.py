"""Learner.update reads as a line of steps (train/learner.py's module doc): each step is a function
in the room that owns it, called by update, and the walk of a batch does not keep coming back to
learner.py's own helpers (issue 40: before this layout, 28 calls from update, all into learner.py
helpers, and 85 entries into learner.py functions per update).

Break checked: update calling a learner.py helper per step again (e.g. a `self._pack` that wraps
pack_sessions) -> the helper is named in the failure."""
import os
import sys

from tiny_world import learner, sessions_v0

import mtrl_jax

PKG = os.path.dirname(os.path.abspath(mtrl_jax.__file__)) + os.sep
LEARNER = os.path.join(PKG, "train", "learner.py")


def test_update_is_a_line_of_steps_in_their_own_rooms():
  lrn = learner()
  batch = list(sessions_v0(0))
  lrn.update(batch, 0)  # compiled before the walk
  steps, back = [], []

  def watch(frame, event, arg):
    if event != "call" or not frame.f_code.co_filename.startswith(PKG):
      return
    name, where = frame.f_code.co_name, frame.f_code.co_filename
    if where == LEARNER and name != "update" and not name.startswith("<"):
      back.append(name)
    caller = frame.f_back
    if caller is not None and caller.f_code.co_filename == LEARNER and caller.f_code.co_name == "update":
      steps.append(f"{os.path.relpath(where, PKG)}:{name}")

  sys.setprofile(watch)
  try:
    lrn.update(batch, 1)
  finally:
    sys.setprofile(None)
  assert steps[:3] == ["train/source.py:choose_sessions", "rollout/packing.py:pack_sessions",
                       "train/scoring.py:score"], steps
  assert "train/credit_step.py:credit" in steps and "train/rl_step.py:run_epochs" in steps, steps
  assert back == ["_count_nonfinite"], back  # the learner's own state: its non-finite counters
  assert len(steps) <= 10, steps
