"""The study's third round (experiments/study/round3.py): its plan as data, the runner's listing of its
jobs, and configs/study.py's arguments its cells use (cue, draws, vpr, dshuffle).

Each test names the break it was checked against (edits made in a scratch copy and reverted).
"""
import contextlib
import io
import json
import re

import pytest

from configs.study import get_config
from experiments.study import plan, round3
from experiments.study.runner import main
from mtrl_jax.config import validate


def _dry_run(tmp_path, *extra) -> tuple[list[list[str]], dict]:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert main(["--round", "3", "--root", str(tmp_path), "--dry_run", *extra]) == 0
  lines = out.getvalue().splitlines()
  return [ln.split() for ln in lines if not ln.startswith(("#", "{"))], json.loads(lines[-1])


def _arg(cmd: list[str], flag: str) -> str:
  return next(x.split("=", 1)[1] for x in cmd if x.startswith(flag + "="))


def test_the_runner_lists_round_3s_jobs_with_the_right_warm_starts(tmp_path):
  """`--round 3 --dry_run`: 3 policy warm starts (delayed with the cue), a full and a partial critic
  per horizon, 74 cells x 8 seeds; every run's config builds, validates and runs the registered recipe
  (round3.RECIPE: 8 x 4 Adam steps an update, lr 2.5e-4, KL 0.1 to the warm start, 32 updates); a partial-critic run starts
  from the partial critic, a vp=off run from the policy warm start, a full-critic run from the full
  critic, a critic warm start from the policy warm start (never from a folder named with vpr=).

  Breaks checked: Cell.warm without the cue (warm starts named without cue=true: the critic-free runs
  would start from round 2's cue-less warm start) fails the warm names; critic_warm without vpr (the
  partial runs start from the full critic) fails the partial check; critic_command's init_from taken
  from the critic name's head (a folder `...,vpr=0.3` that is never built) fails the critic check;
  the runner ignoring --round (round 2's plan listed) fails the counts; base(h) without RECIPE (the runs at
  round 2's one Adam step an update, lr 5e-4, no KL) fails the recipe check."""
  cmds, summary = _dry_run(tmp_path)
  assert summary == {"dry_run": True, "warm_starts": 3, "critic_warm_starts": 6, "runs": 592}
  warm = {_arg(c, "--workdir").rsplit("/", 1)[1] for c in cmds if _arg(c, "--config").endswith("stage=warm")}
  assert warm == {f"probe=delayed,horizon={h},cue=true" for h in (2, 8, 32)}
  critics = [c for c in cmds if "stage=critic" in _arg(c, "--config")]
  assert len(critics) == 6
  for c in critics:
    assert _arg(c, "--config.init_from").rsplit("/", 1)[1] in warm
  runs = [c for c in cmds if "stage=" not in _arg(c, "--config")]
  assert len(runs) == 592
  seen = set()
  for c in runs:
    args = _arg(c, "--config").split(":", 1)[1]
    init = _arg(c, "--config.init_from").rsplit("/", 1)[1]
    if f"vpr={round3.PARTIAL_RATIO:g}" in args:
      assert init.endswith(f",vpr={round3.PARTIAL_RATIO:g},critic,seed=0"), (args, init)
      seen.add("partial")
    elif "vp=false" in args or "gae" not in args:
      assert init in warm, (args, init)
    else:
      assert init.endswith(",cue=true,critic,seed=0") and "vpr" not in init, (args, init)
      seen.add("full")
  assert seen == {"partial", "full"}
  for name in sorted({_arg(c, "--config").split(":", 1)[1].rsplit(",seed=", 1)[0] for c in runs}):
    c = get_config(name + ",seed=3")
    validate(c)  # every cell's config builds and validates
    assert (c.rl.epochs, c.rl.minibatches, c.rl.lr, c.rl.kl_coef, c.rl.kl_mode, c.rl.steps) == (
        8, 4, 2.5e-4, 0.1, "loss", 32), name


def test_every_label_the_plan_compares_is_a_cell_and_the_design_is_complete():
  """The comparisons, factors, graded controls and the pre-registered interaction name cells of their
  experiment; E1 crosses three lambdas with three critic states at H 2, 8, 32 (plus ms_grpo); every
  horizon an experiment runs has q = 1, 0.5, 0.25, 0.1 on each reference arm it uses; the interaction is its
  own family, not among the claims; E6 is cut with its reason; E2 and E5 have their cells.

  Breaks checked: a comparison label with a typo ('gae_lambda095') fails the label check; GRADED_Q
  cut to (1.0,) fails the q check; the interaction's tests appended to E1's comparisons (one Holm family
  with the claims) fails 'pairs only'."""
  for e in round3.EXPERIMENTS:
    labels = {c.label for c in e.cells}
    assert len(labels) == len(e.cells), e.id
    for pair in (*e.comparisons, *(f[:2] for f in e.factors), *(g[:2] for g in e.graded), *e.controls):
      assert set(pair) <= labels, (e.id, pair)
    for _, tests in e.interactions:
      for t in tests:
        assert set(t) <= labels and len(t) == 4, (e.id, t)
    assert all(len(p) == 2 for p in e.comparisons), e.id  # the claims' family holds pairs only
    horizons = {c.full["horizon"] for c in e.cells}
    refs = {r for r, _, _ in e.graded}
    for h in horizons:
      for ref in (r for r in refs if r.endswith(f" h{h}")):
        assert sorted(q for r, _, q in e.graded if r == ref) == [0.1, 0.25, 0.5, 1.0], (e.id, ref)
  e1 = round3.experiment("E1")
  states = {(c.full["arm"], round3.critic_state(c), c.full["horizon"]) for c in e1.cells if not c.full["dshuffle"]}
  assert {(a, s, h) for a in round3.LAMBDA_ARMS for s in ("none", "partial", "full") for h in (2, 8, 32)} <= states
  assert {("ms_grpo", "-", h) for h in (2, 8, 32)} <= states
  (family, tests), = e1.interactions
  assert family == round3.INTERACTION_FAMILY and len(tests) == 2
  assert all(t[0].startswith("gae_lambda1 partial") and t[1].startswith("gae_lambda0.95 partial") for t in tests)
  assert round3.experiment("E6").cut.startswith("not tested") and not round3.experiment("E6").cells
  assert len(round3.experiment("E2").comparisons) == 4 and len(round3.experiment("E5").comparisons) == 4
  assert not any(e.cut for e in round3.EXPERIMENTS if e.id != "E6")


def test_round_3_cells_set_the_probe_the_critic_and_the_control_they_name():
  """A cell's arguments reach the config: cue and draws (draw_seed = seed, but 0 in the warm start),
  vpr (value_pretrain.stop_at_ratio), dshuffle (rl.shuffle_advantages with the decision scope and the
  fraction), vp=false; round 2's cell names do not change (the new keys are at their defaults there).

  Breaks checked: draws applied to the warm stage too (demos on the seed's draws) fails the warm
  check; dshuffle setting the fraction but not the scope fails validate (fraction < 1 with scope
  'all'); vpr dropped fails the stop_at_ratio check."""
  e1 = round3.experiment("E1")
  c = get_config(e1.cell("gae_lambda0.95 partial h8").name + ",seed=5")
  assert c.env.kwargs.cue is True and c.env.kwargs.draw_seed == 5 and c.value_pretrain.stop_at_ratio == round3.PARTIAL_RATIO == 0.3
  assert c.value_pretrain.enabled and c.rl.shuffle_advantages is False
  c = get_config(e1.cell("gae_lambda0.95 none h2").name + ",seed=1")
  assert c.value_pretrain.enabled is False and c.value_pretrain.stop_at_ratio == 0.0
  c = get_config(e1.cell("ms_grpo control q=0.25 h32").name + ",seed=2")
  validate(c)
  assert (c.rl.shuffle_advantages, c.rl.shuffle_scope, c.rl.shuffle_fraction) == (True, "decision", 0.25)
  w = get_config("probe=delayed,horizon=8,cue=true,draws=true,stage=warm,seed=4")
  assert w.env.kwargs.cue is True and w.env.kwargs.get("draw_seed", 0) == 0
  old = plan.experiment("E1").cell("ms_grpo shuffled h8")
  assert old.name == "probe=delayed,horizon=8,arm=ms_grpo,shuffle=true" and old.warm == "probe=delayed,horizon=8"
  for bad, match in (("probe=revisit,cue=true", "cue=true"), ("probe=memory,draws=true", "draws=true"),
                     ("dshuffle=1.5", "dshuffle=1.5"), ("dshuffle=0.5,shuffle=true", "choose one control"),
                     ("vpr=2.0", "vpr=2.0")):
    with pytest.raises(ValueError, match=re.escape(match)):
      get_config(bad)


def test_epochs_and_minibatches_reach_the_config_and_name_the_cell_only_when_set():
  """configs/study.py `epochs` / `mb` (RL's Adam steps an update: epochs x mb; docs/STUDY_ROUND3.md's recipe
  pilot) set rl.epochs / rl.minibatches, appear in a cell's name when not 1, and leave the name of a cell
  at the defaults as it was (its records keep their paths).

  Breaks checked: the arguments parsed but not applied (rl.epochs stays 1); plan.DEFAULTS without them
  (every cell's name gains `epochs=1,mb=1`)."""
  from experiments.study.plan import Cell
  c = get_config("probe=delayed,horizon=8,cue=true,epochs=8,mb=4")
  assert (c.rl.epochs, c.rl.minibatches) == (8, 4)
  assert (get_config("probe=delayed,horizon=8").rl.epochs, get_config("probe=delayed,horizon=8").rl.minibatches) == (1, 1)
  assert "epochs=8" in Cell("x", {"probe": "delayed", "horizon": 8, "arm": "ms_grpo", "epochs": 8, "mb": 4}).name
  plain = Cell("x", {"probe": "delayed", "horizon": 8, "arm": "ms_grpo"}).name
  assert "epochs" not in plain and "mb=" not in plain
  with pytest.raises(ValueError, match="epochs=0"):
    get_config("probe=delayed,epochs=0")


def test_whiten_updates_lr_and_kl_reach_the_config_and_name_the_cell_only_when_set():
  """configs/study.py `whiten`, `updates`, `lr` and `kl` (the recipe pilot's knobs, docs/STUDY_ROUND3.md)
  set rl.whiten_advantages, rl.steps with the eval at the last update, rl.lr and rl.kl_coef; a cell at the defaults
  keeps its name (32 updates, lr 5e-4, no whitening: the second round's records keep their paths);
  out-of-range values name the argument.

  Breaks checked: eval.every left at 32 (a 16-update run then has no eval at its end, only the step-0
  one); `lr` parsed but rl.lr left at 5e-4; `kl` parsed but not applied; plan.DEFAULTS without `lr` or
  without `kl` (a cell's name drops it: two cells that differ only there would share a folder)."""
  from experiments.study.plan import Cell
  c = get_config("probe=delayed,horizon=8,cue=true,whiten=true,updates=16,lr=2.5e-4,kl=0.1")
  assert (c.rl.whiten_advantages, c.rl.steps, c.eval.every, c.rl.lr, c.rl.kl_coef) == (True, 16, 16, 2.5e-4, 0.1)
  d = get_config("probe=delayed,horizon=8")
  assert (d.rl.whiten_advantages, d.rl.steps, d.eval.every, d.rl.lr, d.rl.kl_coef) == (False, 32, 32, 5e-4, 0.0)
  named = Cell("x", {"probe": "delayed", "horizon": 8, "arm": "ms_grpo", "updates": 16, "lr": 2.5e-4,
                     "whiten": True, "kl": 0.1}).name
  assert all(k in named for k in ("updates=16", "lr=0.00025", "whiten=true", "kl=0.1"))  # else two cells, one folder
  plain = Cell("x", {"probe": "delayed", "horizon": 8, "arm": "ms_grpo"}).name
  assert not any(k in plain for k in ("updates", "lr=", "whiten", "kl="))
  for bad, field in (("updates=0", "updates=0"), ("lr=0", "lr=0"), ("lr=2", "lr=2"), ("kl=-0.1", "kl=-0.1")):
    with pytest.raises(ValueError, match=field):
      get_config(f"probe=delayed,{bad}")


def test_every_critic_warm_start_has_no_wall_time_cap_and_stops_on_its_readouts(tmp_path):
  """Each critic job the runner lists (full and partial, every horizon) pretrains with no wall-time cap, the bar
  stop on and its readout on 256 tasks: where a critic stops must not depend on the machine's load (the H=32
  critic took 928 s for 33 rounds on a lightly loaded core; 3,600 s would bind under two parallel jobs).
  Break checked: configs/study.py without `value_pretrain.max_seconds = 0` (3,600 s: every critic fails)."""
  cmds, _ = _dry_run(tmp_path)
  critics = [_arg(c, "--config").split(":", 1)[1] for c in cmds if "stage=critic" in _arg(c, "--config")]
  assert len(critics) == 6
  for name in critics:
    v = get_config(name).value_pretrain
    assert (v.max_seconds, v.stop_at_bar, v.readout_tasks) == (0.0, True, 256), name
    assert v.stop_at_ratio == (round3.PARTIAL_RATIO if "vpr=" in name else 0.0), name
