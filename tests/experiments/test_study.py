"""experiments/study/plan.py and runner.py: the study's plan is what the report and the docs say it is."""
import json
import os

import pytest

from configs import study as study_config
from experiments.study import plan as study
from experiments.study import runner
from mtrl_jax.credit.registry import hparam_defaults


def test_every_cell_is_a_valid_config_and_shared_cells_run_once():
  """Each cell's name parses back into configs/study.py arguments that build a config with the
  cell's settings; a cell used by two experiments is one run folder. Catches a name that drops a
  varied key (two cells in one folder), an arm or probe configs/study.py rejects, a horizon that does
  not reach the env, and E3/E4 running their own copies of E1's cells."""
  plan = study.planned_runs()
  cells = {c.name: c for c in plan.values()}
  # This round (E2, E5 cut): delayed at 3 horizons x 7 distinct cells (E1's ms_grpo, dr_grpo,
  # gae_lambda0.95, gae_lambda1 and the shuffled control; E3's vp=off; E4's decoupled) and revisit at 2
  # horizons x 6 cells (E6's five arms and its control), 8 seeds each: (21 + 12) x 8 = 264 runs.
  assert len(plan) == (3 * 7 + 2 * 6) * 8 == 264
  assert all(not e.cut for e in study.EXPERIMENTS if e.id in ("E1", "E3", "E4", "E6"))
  assert not any(c.full["eta"] or c.full["context"] != "session" for c in cells.values())  # E2/E5 cut
  for name, cell in cells.items():
    c = study_config.get_config(name)
    full = {**study.DEFAULTS, **cell.args}
    assert c.env.kwargs["horizon"] == full["horizon"] and c.rl.decoupled == full["decoupled"]
    assert c.env.name == study_config.PROBES[full["probe"]][0] and c.env.kwargs["crn"] is False
    assert c.value_pretrain.enabled == full["vp"] and c.asynchronous.enabled == (full["eta"] > 0)
  e1, e3, e4 = (study.experiment(x) for x in ("E1", "E3", "E4"))
  for h in study.HORIZONS:
    assert e3.cell(f"gae_lambda0.95 vp=on h{h}").name == e1.cell(f"gae_lambda0.95 h{h}").name
    assert e4.cell(f"policy 0.95 critic 0.95 h{h}").name == e1.cell(f"gae_lambda0.95 h{h}").name
    assert e4.cell(f"policy 1.0 critic 1.0 h{h}").name == e1.cell(f"gae_lambda1 h{h}").name
    for e in (e3, e4):  # E1's control at that horizon, the same runs
      assert e.cell(f"ms_grpo shuffled h{h}").name == e1.cell(f"ms_grpo shuffled h{h}").name
  assert max(study.HORIZONS) >= 32  # issue 32: the sweep reaches 32 turns
  lams = {(h, tuple(study_config.get_config(c.name).rl.estimator_kwargs[k] for k in ("lambda_policy", "lambda_critic")))
          for c in e4.cells if (h := c.full["horizon"]) and c.full["arm"] != "ms_grpo"}
  assert lams == {(h, lam) for h in study.HORIZONS for lam in ((0.95, 1.0), (0.95, 0.95), (1.0, 1.0))}
  e6 = study.experiment("E6")
  got = {(study_config.get_config(c.name).rl.estimator, c.full["probe"], c.full["horizon"]) for c in e6.cells}
  assert got == {(est, "revisit", h) for est in ("gigpo", "hgpo", "ms_grpo", "grpo") for h in study.E6_HORIZONS}
  assert all(study_config.get_config(c.name).rl.steps == study_config.get_config(e1.cell("ms_grpo h8").name).rl.steps
             for c in e6.cells)


def test_normalisation_arms_and_positive_controls():
  """The normalisation factor's arms differ from their partners in scale_by_std only, and every
  experiment's control is its reference cell with rl.shuffle_advantages on and nothing else changed.
  Catches dr_grpo left std-scaled (= ms_grpo: the factor would read 0 by construction), gigpo_std left
  mean-only, a control that changes more than the shuffle, and a comparison powered by another
  horizon's control (a control separates or not at its own horizon)."""
  cfg = lambda e, label: study_config.get_config(study.experiment(e).cell(label).name)  # noqa: E731
  for e, a, b in (("E1", "ms_grpo h8", "dr_grpo h8"), ("E6", "gigpo_std h4", "gigpo h4"),
                  ("E6", "ms_grpo h16", "dr_grpo h16")):
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
    for a, b in e.comparisons + tuple((a, b) for a, b, _ in e.factors):
      ctl = e.control_for(a)
      assert e.cell(ctl[0]).warm == e.cell(a).warm == e.cell(b).warm, (e.id, a, b, ctl)
  assert study.experiment("E1").control_for("gae_lambda1 h32") == ("ms_grpo h32", "ms_grpo shuffled h32")
  e6 = study.experiment("E6")
  assert e6.control_for("gigpo h16") == ("ms_grpo h16", "ms_grpo shuffled h16")
  factors = {f for _, _, f in e6.factors}
  assert any(f.startswith("normalisation") for f in factors) and any(f.startswith("credit") for f in factors)


def test_dry_run_passes_the_warm_start_to_every_run(capsys):
  """E4's critic arms with value pretraining start from their horizon's one critic warm start (seed
  0), which starts from that horizon's policy warm start; E3's vp=off cells and the control start from
  the policy warm start (no pretrained critic). Catches a critic warm start per seed (8x the value
  pretraining), a vp=on run without the critic, a vp=off run handed one, or another horizon's."""
  assert runner.main(["--root", "/tmp/nowhere", "--only", "E4,E3", "--horizons", "8", "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  summary = json.loads(lines[-1])
  # h8: gae_decoupled, gae_lambda0.95, gae_lambda1, gae_lambda0.95 vp=off, ms_grpo and its shuffle
  assert summary["runs"] == 6 * len(study.SEEDS) and summary["critic_warm_starts"] == 1
  cmds = [x for x in lines[:-1] if not x.startswith("#")]
  critic = [x for x in cmds if "stage=critic" in x]
  runs = [x for x in cmds if "stage=" not in x]
  assert len(runs) == 6 * len(study.SEEDS) and len(critic) == 1 and "stage=critic,seed=0 " in critic[0]
  warm = "--config.init_from=/tmp/nowhere/warm/probe=delayed,horizon=8"
  assert all(warm + " " in x + " " for x in critic)
  for x in runs:
    if "vp=false" in x or "arm=ms_grpo" in x:
      assert x.endswith(warm), x
    else:
      assert x.endswith(warm + ",critic,seed=0"), x
  with pytest.raises(KeyError):
    runner.main(["--root", "/tmp/nowhere", "--only", "E9", "--dry_run"])


def test_lab_jobs_match_the_warm_starts_they_load():
  """Catches the memory lab run on the hinted task while its warm start learned the unhinted one
  (the lab's env must be the probe's), and a lab pointed at another probe's warm start."""
  from configs import lab as lab_config
  for probe in study.LAB_PROBES:
    _, cmd, workdir = runner.lab_job("python", "/r", probe)
    cfg_arg = next(x for x in cmd if x.startswith("--config=")).split(":", 1)[1]
    lab = lab_config.get_config(cfg_arg)
    probe_cfg = study_config.get_config(f"probe={probe},horizon={study.LAB_HORIZON},stage=warm")
    assert lab.env.name == probe_cfg.env.name
    assert dict(lab.env.kwargs) == dict(probe_cfg.env.kwargs)
    assert f"--config.init_from=/r/warm/probe={probe},horizon={study.LAB_HORIZON}" in cmd


def test_probe_arms_and_critic_filters_cut_cells_not_seeds(capsys):
  """--probe, --horizons, --arms and --critic keep whole cells (every seed) and nothing else; an arm no
  cell has is an error naming it. Catches a filter that is ignored (more runs) or drops seeds."""
  assert runner.main(["--root", "/tmp/nowhere", "--only", "E6", "--horizons", "16", "--arms", "gigpo,hgpo",
                     "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert json.loads(lines[-1])["runs"] == 2 * len(study.E6_SEEDS)
  runs = [x for x in lines[:-1] if not x.startswith("#") and "stage=" not in x]
  assert len(runs) == 16 and all("probe=revisit,horizon=16" in x and ("arm=gigpo" in x or "arm=hgpo" in x)
                                 for x in runs)
  assert runner.main(["--root", "/tmp/nowhere", "--only", "E3", "--critic", "none", "--dry_run"]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  # per horizon: vp=off, ms_grpo and its shuffle
  assert summary["runs"] == 3 * len(study.HORIZONS) * len(study.SEEDS) and summary["critic_warm_starts"] == 0
  assert runner.main(["--root", "/tmp/nowhere", "--probe", "delayed", "--horizons", "2", "--dry_run"]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary == {"dry_run": True, "warm_starts": 1, "critic_warm_starts": 1, "runs": 7 * len(study.SEEDS)}
  # a cut experiment runs only when named
  assert runner.main(["--root", "/tmp/nowhere", "--only", "E5", "--dry_run"]) == 0
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"] == 5 * len(study.SEEDS)
  with pytest.raises(SystemExit):
    runner.main(["--root", "/tmp/nowhere", "--arms", "bogus", "--dry_run"])
  assert "no cell has ['bogus']" in capsys.readouterr().err


def test_a_finished_run_writes_its_record_with_the_cells_arguments(tmp_path):
  """runner.write_record (what each finished job calls) files a run under runs/<cell>/seed=<s>.json with
  the cell's full configs/study.py arguments and its final success; an unfinished run writes nothing.
  Break checked: the record written with the arguments parsed from the folder name (strings, and no
  'shuffle') instead of the cell's fails the args check."""
  from experiments.study import records
  cell = study.experiment("E1").cell("ms_grpo shuffled h8")
  name = f"{cell.name},seed=3"
  wd = tmp_path / "runs" / name
  wd.mkdir(parents=True)
  lines = [{"step": 0, "stage": "rl", "eval/success": 0.5},
           {"step": 1, "stage": "rl", "rollout/success": 0.4, "tokens_seen": 100.0}]
  (wd / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  assert runner.write_record(str(tmp_path / "rec"), {name: cell}, name, str(wd)) is None
  with open(wd / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 1, "stage": "eval", "eval/success": 0.25}) + "\n")
  path = runner.write_record(str(tmp_path / "rec"), {name: cell}, name, str(wd))
  assert path == str(tmp_path / "rec" / "runs" / cell.name / "seed=3.json")
  rec = records.load(str(tmp_path / "rec"))["runs"][(cell.name, 3)]
  assert rec["args"] == cell.full and rec["args"]["shuffle"] is True and rec["final"]["success"] == 0.25
  # the code it was made with: this checkout's commit, trees of mtrl_jax/ and configs/ and the dirty flag
  assert rec["commit"] != "unknown" and set(rec["tree"]) == {"mtrl_jax", "configs"} and isinstance(rec["dirty"], bool)
  # the converter finds the same run under the root and records the same numbers
  n = records.export(str(tmp_path), str(tmp_path / "conv"))
  assert n == {"runs": 1, "critics": 0, "warm": 0}
  conv = records.load(str(tmp_path / "conv"))["runs"][(cell.name, 3)]
  assert conv["final"] == rec["final"] and conv["auc"] == rec["auc"]
