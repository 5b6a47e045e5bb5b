"""experiments/study.py: the study's plan is what the report and the docs say it is."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments"))
import study  # noqa: E402
from configs import study as study_config  # noqa: E402
from mtrl_jax.credit.registry import hparam_defaults  # noqa: E402


def test_every_cell_is_a_valid_config_and_shared_cells_run_once():
  """Each cell's name parses back into configs/study.py arguments that build a config with the
  cell's settings; a cell used by two experiments is one run folder. Catches a name that drops a
  varied key (two cells in one folder), an arm or probe configs/study.py rejects, and an E2
  synchronous cell that is not E5's trajectory grpo run."""
  plan = study.planned_runs()
  cells = {c.name: c for c in plan.values()}
  # E1-E5: 240 runs (30 distinct cells x 8 seeds: 24 before issue 32, E1's dr_grpo and rloo, and the
  # shuffled controls of E1, E1m, E2 (= E5's), E3, E4); E6 adds 96: its 8 new-arm cells, rloo, dr_grpo
  # on memory and gigpo_std on both probes x 8 seeds (its ms_grpo, gae_lambda1, dr_grpo and rloo cells
  # on bifurcation and its controls are E1's and E1m's runs).
  assert len(plan) == len({(c.name, s) for e in study.EXPERIMENTS for c in e.cells for s in e.seeds}) == 336
  assert len(study.planned_runs([e.id for e in study.EXPERIMENTS if e.id != "E6"])) == 240
  for name, cell in cells.items():
    c = study_config.get_config(name)
    full = {**study.DEFAULTS, **cell.args}
    assert c.env.kwargs["length"] == full["horizon"] and c.rl.decoupled == full["decoupled"]
    assert c.env.name == study_config.PROBES[full["probe"]][0]
    assert c.value_pretrain.enabled == full["vp"] and c.asynchronous.enabled == (full["eta"] > 0)
  e1, e2 = study.experiment("E1"), study.experiment("E2")
  assert e2.cell("decoupled eta=0").name == study.experiment("E5").cell("trajectory grpo").name
  # E1 on memory: E1's arms at the long horizon (those the claim names), on the memory probe without the hint
  e1m = study.experiment("E1m")
  assert [c.args["arm"] for c in e1m.cells] == list(study.E1M_ARMS) + ["ms_grpo"]  # + its control
  assert set(study.E1M_ARMS) <= set(study.E1_ARMS) >= {"gae_lambda0.95", "gae_lambda1", "gae_decoupled",
                                                       "gae_length_adaptive", "ms_grpo"}
  assert all(study_config.get_config(c.name).env.kwargs["hint"] is False for c in e1m.cells)
  assert not {c.name for c in e1m.cells} & {c.name for c in e1.cells}
  # E4's grid: the four corners are four different (lambda_policy, lambda_critic) settings
  lams = set()
  for cell in study.experiment("E4").cells:
    kw = study_config.get_config(cell.name).rl.estimator_kwargs
    lams.add((kw["lambda_policy"], kw["lambda_critic"]))
  assert lams == {(0.95, 0.95), (1.0, 1.0), (0.95, 1.0), (1.0, 0.95)}
  # E6: the new estimators and the references on both long-horizon probes, 8 seeds, E1's recipe;
  # its reference cells are E1's / E1m's runs (shared folders), run on for seeds 5-7.
  e6 = study.experiment("E6")
  assert e6.seeds == tuple(range(8))
  got = {(study_config.get_config(c.name).rl.estimator, study_config.get_config(c.name).env.name) for c in e6.cells}
  assert got == {(est, env) for est in ("gigpo", "hgpo", "mt_grpo", "progress", "ms_grpo", "rloo", "gae", "grpo")
                 for env in ("bifurcation", "memory")}
  assert e6.cell("ms_grpo bifurcation").name == e1.cell("ms_grpo h8").name
  assert e6.cell("gae_lambda1 memory").name == e1m.cell("gae_lambda1 h8").name
  assert all(study_config.get_config(c.name).rl.steps == study_config.get_config(e1.cell("ms_grpo h8").name).rl.steps
             for c in e6.cells)


def test_normalisation_arms_and_positive_controls():
  """The normalisation factor's arms differ from their partners in scale_by_std only, and every
  experiment's control is its reference cell with rl.shuffle_advantages on and nothing else changed.
  Catches dr_grpo left std-scaled (= ms_grpo: the factor would read 0 by construction), gigpo_std left
  mean-only, a control that changes more than the shuffle, and a comparison powered by the other
  probe's control."""
  cfg = lambda e, label: study_config.get_config(study.experiment(e).cell(label).name)  # noqa: E731
  for e, a, b in (("E1", "ms_grpo h8", "dr_grpo h8"), ("E6", "gigpo_std memory", "gigpo memory"),
                  ("E6", "ms_grpo bifurcation", "dr_grpo bifurcation")):
    ca, cb = cfg(e, a), cfg(e, b)
    std = lambda c: {**hparam_defaults(c.rl.estimator), **dict(c.rl.estimator_kwargs)}["scale_by_std"]  # noqa: E731
    assert std(ca) is True and std(cb) is False
    assert ca.rl.estimator.replace("ms_", "") == cb.rl.estimator.replace("ms_", "")
  for e in study.EXPERIMENTS:
    assert e.controls, f"{e.id} has no positive control"
    for real, shuf in e.controls:
      cr, cs = cfg(e.id, real), cfg(e.id, shuf)
      assert cs.rl.shuffle_advantages is True and cr.rl.shuffle_advantages is False
      cs.rl.shuffle_advantages = False
      assert cs.to_json() == cr.to_json()
    for a, b in e.comparisons:
      ctl = e.control_for(a)
      assert e.cell(ctl[0]).full["probe"] == e.cell(a).full["probe"]
  e6 = study.experiment("E6")
  assert e6.control_for("gigpo memory") == ("ms_grpo memory", "ms_grpo shuffled memory")
  factors = {f for _, _, f in e6.factors}
  assert any(f.startswith("normalisation") for f in factors) and any(f.startswith("credit") for f in factors)


def test_dry_run_passes_the_warm_start_to_every_run(capsys):
  """E4's cells are critic arms with value pretraining: every seed's run starts from the probe's
  one critic warm start (seed 0), which starts from the probe's policy warm start; E3's vp=off
  cells start from the policy warm start (no pretrained critic). Catches a critic warm start per
  seed (8x the value pretraining), a vp=on run without the critic, or a vp=off run handed one."""
  assert study.main(["--root", "/tmp/nowhere", "--only", "E4,E3", "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  summary = json.loads(lines[-1])
  # 6 cells before issue 32 and the shuffled gae_lambda0.95 control E3 and E4 share
  assert summary["runs"] == 7 * len(study.SEEDS) and summary["critic_warm_starts"] == 1
  cmds = [x for x in lines[:-1] if not x.startswith("#")]
  critic = [x for x in cmds if "stage=critic" in x]
  runs = [x for x in cmds if "stage=" not in x]
  assert len(runs) == 7 * len(study.SEEDS) and len(critic) == 1 and "stage=critic,seed=0 " in critic[0]
  assert all("--config.init_from=/tmp/nowhere/warm/probe=bifurcation,horizon=8 " in x + " " for x in critic)
  for x in runs:
    if "vp=false" in x:
      assert x.endswith("--config.init_from=/tmp/nowhere/warm/probe=bifurcation,horizon=8"), x
    else:
      assert x.endswith("--config.init_from=/tmp/nowhere/warm/probe=bifurcation,horizon=8,critic,seed=0"), x
  with pytest.raises(KeyError):
    study.main(["--root", "/tmp/nowhere", "--only", "E9", "--dry_run"])


def test_lab_jobs_match_the_warm_starts_they_load():
  """Catches the memory lab run on the hinted task while its warm start learned the unhinted one
  (the lab's env must be the probe's), and a lab pointed at another probe's warm start."""
  from configs import lab as lab_config
  for probe in study.LAB_PROBES:
    _, cmd, workdir = study.lab_job("python", "/r", probe)
    cfg_arg = next(x for x in cmd if x.startswith("--config=")).split(":", 1)[1]
    lab = lab_config.get_config(cfg_arg)
    probe_cfg = study_config.get_config(f"probe={probe},horizon={max(study.E1_HORIZONS)},stage=warm")
    assert lab.env.name == probe_cfg.env.name
    assert dict(lab.env.kwargs) == dict(probe_cfg.env.kwargs)
    assert f"--config.init_from=/r/warm/probe={probe},horizon={max(study.E1_HORIZONS)}" in cmd


def test_probe_arms_and_critic_filters_cut_cells_not_seeds(capsys):
  """--probe, --arms and --critic keep whole cells (every seed) and nothing else; an arm no cell has
  is an error naming it. Catches a filter that is ignored (56 runs instead of 16) or drops seeds."""
  assert study.main(["--root", "/tmp/nowhere", "--only", "E6", "--probe", "memory", "--arms", "gigpo,rloo",
                     "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert json.loads(lines[-1])["runs"] == 2 * len(study.E6_SEEDS)
  runs = [x for x in lines[:-1] if not x.startswith("#") and "stage=" not in x]
  assert len(runs) == 16 and all("probe=memory" in x and ("arm=gigpo" in x or "arm=rloo" in x) for x in runs)
  assert study.main(["--root", "/tmp/nowhere", "--only", "E3", "--critic", "none", "--dry_run"]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["runs"] == 2 * len(study.SEEDS) and summary["critic_warm_starts"] == 0  # the vp=off cells
  with pytest.raises(SystemExit):
    study.main(["--root", "/tmp/nowhere", "--arms", "bogus", "--dry_run"])
  assert "no cell has ['bogus']" in capsys.readouterr().err


def test_a_finished_run_writes_its_record_with_the_cells_arguments(tmp_path):
  """study.write_record (what each finished job calls) files a run under runs/<cell>/seed=<s>.json with
  the cell's full configs/study.py arguments and its final success; an unfinished run writes nothing.
  Break checked: the record written with the arguments parsed from the folder name (strings, and no
  'shuffle') instead of the cell's fails the args check."""
  import records
  cell = study.experiment("E1").cell("ms_grpo shuffled h8")
  name = f"{cell.name},seed=3"
  wd = tmp_path / "runs" / name
  wd.mkdir(parents=True)
  lines = [{"step": 0, "stage": "rl", "eval/success": 0.5},
           {"step": 1, "stage": "rl", "rollout/success": 0.4, "tokens_seen": 100.0}]
  (wd / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  assert study.write_record(str(tmp_path / "rec"), {name: cell}, name, str(wd)) is None
  with open(wd / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 1, "stage": "eval", "eval/success": 0.25}) + "\n")
  path = study.write_record(str(tmp_path / "rec"), {name: cell}, name, str(wd))
  assert path == str(tmp_path / "rec" / "runs" / cell.name / "seed=3.json")
  rec = records.load(str(tmp_path / "rec"))["runs"][(cell.name, 3)]
  assert rec["args"] == cell.full and rec["args"]["shuffle"] is True and rec["final"]["success"] == 0.25
  # the converter finds the same run under the root and records the same numbers
  n = records.export(str(tmp_path), str(tmp_path / "conv"))
  assert n == {"runs": 1, "critics": 0, "warm": 0}
  conv = records.load(str(tmp_path / "conv"))["runs"][(cell.name, 3)]
  assert conv["final"] == rec["final"] and conv["auc"] == rec["auc"]
