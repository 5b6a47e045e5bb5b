"""The credit-assignment study on the real model (issue 32 item 8): configs/study.py:model=smol and
python -m experiments.study --model smol. Quick: the byte cells are unchanged, the smol cells are the byte cells'
design on SmolLM2 with configs/smol.py's settings, every smol name leads with model=smol. Slow: the smol
plan end to end at smoke size on a 2-block cut of SmolLM2, its records, and the report over them."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from configs import smol as smol_config
from configs import study as study_config
from experiments.study import plan as study
from experiments.study import records, runner
from mtrl_jax import config as config_lib
from mtrl_jax.envs import registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# configs/study.py before it had a `model` argument: the byte cells must build the same config from it.
BEFORE = "11f557b"  # value pretraining without a wall-time cap: the last deliberate change to the byte cells
BYTE_CELLS = ("probe=delayed,horizon=2,stage=warm", "probe=delayed,horizon=8,arm=gae_lambda0.95,seed=3",
              "probe=delayed,horizon=32,stage=critic", "probe=revisit,horizon=16,arm=gigpo,shuffle=true",
              "probe=bifurcation,horizon=8,arm=tree,runlocal=true", "probe=keydoor,horizon=5,stage=warm",
              "probe=delayed,horizon=8,arm=ms_grpo,eta=4,decoupled=false,context=markov,tpa=10,crn=true")


def _config_before(tmp_path):
  try:
    src = subprocess.run(["git", "show", f"{BEFORE}:configs/study.py"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    pytest.skip(f"configs/study.py at {BEFORE} not readable from git here: {e}")
  path = tmp_path / "study_before.py"
  path.write_text(src)
  spec = importlib.util.spec_from_file_location("study_config_before", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_byte_cells_build_the_config_they_built_before_the_model_argument(tmp_path):
  """Every field of the byte model's config, for warm / critic / RL cells of each probe kind (runlocal
  and the rarer knobs included), equals what configs/study.py built at BEFORE, with and without
  model=byte. Catches any smol setting leaking into the byte study (a learning rate, a cap, a size, the
  env style): the study's running records were made with the old configs. A deliberate change to the
  byte cells moves BEFORE to the commit that made it."""
  before = _config_before(tmp_path)
  for cell in BYTE_CELLS:
    want = before.get_config(cell).to_json(sort_keys=True)
    assert study_config.get_config(cell).to_json(sort_keys=True) == want, cell
    assert study_config.get_config(cell + ",model=byte").to_json(sort_keys=True) == want, cell


@pytest.fixture()
def hf_dir(tmp_path):
  (tmp_path / "config.json").write_text("{}")  # validate() only checks the folder has one
  return str(tmp_path)


def test_smol_cell_is_the_byte_cells_design_on_smollm2(hf_dir):
  """A smol cell keeps the byte cell's design (env and its kwargs but the style, estimator and its
  kwargs, critic, shuffle, vp, seed, group size, tasks per update) and takes configs/smol.py's model
  settings (folder, precision, remat, chunked logits, chat role, learning rates), for warm, critic and
  RL stages, and validates (the pretrained-model learning-rate guard included). Catches the byte
  model's learning rates reaching SmolLM2, a terse env, a smol cell that is another cell, configs/smol.py's
  settings copied and drifting, and an unknown model or a stray hf_dir passing silently."""
  ref = smol_config.get_config(f"hf_dir={hf_dir}")
  for cell in study.planned_runs(model="smol").values():
    name = cell.name
    assert name.startswith("model=smol,")
    for stage in ("", ",stage=warm", ",stage=critic"):
      byte = study_config.get_config(name.removeprefix("model=smol,") + stage)
      c = study_config.get_config(f"{name}{stage},hf_dir={hf_dir}")
      config_lib.validate(c, num_devices=1)
      assert c.hf_dir == hf_dir and c.env.kwargs.style == "natural" and c.env.name == byte.env.name
      assert {k: v for k, v in c.env.kwargs.items() if k != "style"} == dict(byte.env.kwargs)
      for key in ("rl.estimator", "rl.estimator_kwargs", "critic.kind", "rl.shuffle_advantages", "seed",
                  "value_pretrain.enabled", "rl.group_size", "rl.tasks_per_update", "stages", "demos.quality",
                  "rl.decoupled", "rollout.turn_budget"):
        assert _get(c, key) == _get(byte, key), (name, stage, key)
      for key in ("model.dtype", "model.param_dtype", "model.remat", "model.logits_chunk", "model.scan_layers",
                  "model.attention", "chat.prompt_role", "sft.lr", "rl.lr", "rl.critic_lr"):
        assert _get(c, key) == _get(ref, key), (name, stage, key)
    rl = study_config.get_config(name)
    assert rl.hf_dir == smol_config.DEFAULT_HF_DIR  # the default folder is configs/smol.py's
    assert (rl.rl.steps, rl.eval.every, rl.eval.tasks) == (study_config.SMOL_RL_STEPS,) * 2 + (
        study_config.SMOL_EVAL_TASKS,)
  with pytest.raises(ValueError, match="model='gpt2'"):
    study_config.get_config("model=gpt2")
  with pytest.raises(ValueError, match="hf_dir="):
    study_config.get_config(f"hf_dir={hf_dir}")  # the byte model reads no folder


def _get(c, dotted):
  for part in dotted.split("."):
    if part not in c:  # a field only some stages set (rl.shuffle_advantages: RL only)
      return None
    c = c[part]
  return c.to_dict() if hasattr(c, "to_dict") else (tuple(c) if isinstance(c, (list, tuple)) else c)


def _expert_tokens(tok, name, kwargs, seed):
  from mtrl_jax.models.chat import conversation
  env = registry.make(name, **kwargs)
  r = env.reset(seed)
  obs, acts = [r.observation], []
  while True:
    acts.append(env.expert_action())
    step = env.step(acts[-1])
    if step.terminated or step.truncated:
      break
    obs.append(step.observation)
  return len(tok.encode(tok.chat.template.render(conversation(r.prompt, obs, acts, "system"))))


def test_smol_context_cap_holds_the_expert_session_and_a_full_turn_budget_a_turn(smollm2_2layer):
  """With SmolLM2's tokenizer and chat template, the expert's whole natural-style session, plus a
  full turn budget on every turn (the longest sampled replies), fits the cap, for delayed at H in
  {2, 8, 32} and revisit at H in {4, 16}. Catches the byte cap (bytes, not tokens) or a cap that cuts
  the sessions of the long horizons (a session that hits the cap ends untrained-for)."""
  from mtrl_jax.models.tokenizer import HFTokenizer
  tok = HFTokenizer(smollm2_2layer, prompt_role="system")
  for probe, h in (("delayed", 2), ("delayed", 8), ("delayed", 32), ("revisit", 4), ("revisit", 16)):
    c = study_config.get_config(f"model=smol,probe={probe},horizon={h}")
    kwargs = dict(c.env.kwargs)
    longest = max(_expert_tokens(tok, c.env.name, kwargs, s) for s in range(8))
    assert longest + h * c.rollout.turn_budget <= c.rollout.context_cap, (probe, h, longest)


def test_smol_plan_names_lead_with_the_model_and_never_meet_the_byte_plans(capsys):
  """The smol plan: E1's claim cells and control at SMOL_HORIZONS, SMOL_SEEDS; every run, warm start,
  critic warm start and record path leads with model=smol and none is a byte name; --hf_dir reaches
  every job's config (warm starts and critics too), --runlocal too; the byte plan is untouched by it.
  Catches a smol run resuming (or overwriting) a byte run's folder or record, a warm start built from
  the default folder while the runs read --hf_dir, and a comparison left pointing at a cut cell."""
  runs = study.planned_runs(model="smol")
  byte = study.planned_runs()
  assert len(runs) == len(study.SMOL_HORIZONS) * (len(study.SMOL_ARMS) + 1) * len(study.SMOL_SEEDS) == 16
  assert not set(runs) & set(byte) and all(n.startswith("model=smol,probe=delayed,") for n in runs)
  (e,) = study.plan("smol")
  labels = {c.label for c in e.cells}
  assert e.id == "E1" and e.seeds == study.SMOL_SEEDS
  assert e.comparisons and all(set(p) <= labels for p in (*e.comparisons, *e.controls))
  assert len(e.controls) == len(study.SMOL_HORIZONS)
  assert study.experiment("E1").cells != e.cells and study.experiment("E1", "smol") is e
  for name, cell in runs.items():
    rec = {"kind": "run", "cell": name.rpartition(",seed=")[0], "seed": 0}
    assert os.path.relpath(records.path_of("/o", rec), "/o").startswith("runs/model=smol,")
    assert cell.warm.startswith("model=smol,") and cell.full["model"] == "smol"
  assert runner.main(["--root", "/r", "--model", "smol", "--hf_dir", "/h", "--runlocal", "--dry_run"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert json.loads(lines[-1]) == {"dry_run": True, "warm_starts": 2, "critic_warm_starts": 2, "runs": 16}
  cmds = [x for x in lines[:-1] if not x.startswith("#")]
  assert len(cmds) == 20
  for x in cmds:
    arg = next(w for w in x.split() if w.startswith("--config=configs/study.py:"))
    assert arg.startswith("--config=configs/study.py:model=smol,") and arg.endswith(",hf_dir=/h,runlocal=true"), x
    assert "--workdir=/r/warm/model=smol," in x or "--workdir=/r/runs/model=smol," in x
    init = [w for w in x.split() if w.startswith("--config.init_from=")]
    assert all(w.startswith("--config.init_from=/r/warm/model=smol,") for w in init)
  with pytest.raises(SystemExit):
    runner.main(["--root", "/r", "--hf_dir", "/h", "--dry_run"])  # the byte study reads no folder
  assert "--hf_dir" in capsys.readouterr().err


@pytest.mark.slow
def test_smol_study_end_to_end_at_smoke_size(smollm2_2layer, tmp_path):
  """python -m experiments.study --model smol at smoke size (runlocal, 1 seed, horizon 2, 2 RL updates) on a
  2-block cut of SmolLM2, all jobs in one process: the warm start, the critic warm start and three runs
  (ms_grpo, its shuffled control, gae lambda 0.95 from the pretrained critic; gae lambda 1 is left out: it
  runs the same programs as lambda 0.95, ~75 s more here) finish and leave records whose names lead with
  model=smol, whose configs are the natural-style env on the folder, and which the report (--model smol)
  reads as E1's cells while the byte report over the same folder sees none of them. Catches a stage
  failing on the chat path (value pretraining, a critic arm), a record under a byte name, a finished
  run keeping its checkpoint (16 of them fill a GPU machine's disk), and the report failing on smol
  records. On the shared 2-core CPU (2026-11-28): 5 min 55 s under pytest at load 8-11; 9 min 37 s with all
  four arms outside pytest at load 10-12."""
  root, rec = tmp_path / "root", tmp_path / "records"
  # One CPU device (the tests' 8 fake ones slow a job down several times), XLA level 0 as the suite.
  env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", "experiments.study", "--model", "smol", "--root", str(root),
                        "--hf_dir", smollm2_2layer, "--runlocal", "--seeds", "1", "--horizons", "2",
                        "--arms", "ms_grpo,gae_lambda0.95", "--in_process", "--records", str(rec),
                        "--config.rl.steps=2"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])["failed"] == []
  got = records.load(str(rec))
  cells = {"model=smol,probe=delayed,horizon=2,arm=" + a for a in ("ms_grpo", "ms_grpo,shuffle=true", "gae_lambda0.95")}
  assert set(got["runs"]) == {(c, 0) for c in cells}
  assert set(got["warm"]) == {"model=smol,probe=delayed,horizon=2"}
  assert set(got["critics"]) == {("model=smol,probe=delayed,horizon=2", 0)}
  for r in got["runs"].values():
    assert r["args"]["model"] == "smol" and r["config"]["env.kwargs"]["style"] == "natural"
    assert r["final"]["success"] is not None and r["config"]["rl.steps"] == 2
  for c in cells:
    run = root / "runs" / f"{c},seed=0"
    assert (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists(), c
  cfg = json.load(open(root / "runs" / "model=smol,probe=delayed,horizon=2,arm=ms_grpo,seed=0" / "config.json"))
  assert cfg["hf_dir"] == smollm2_2layer and cfg["model"]["n_layers"] == 2
  results = {}
  for model in ("smol", "byte"):
    rep = subprocess.run([sys.executable, "-m", "experiments.study.report", "--model", model, "--records", str(rec), "--out",
                          str(tmp_path / f"STUDY_{model}.md"), "--figdir", str(tmp_path / f"fig_{model}")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    results[model] = json.loads(rep.stdout.strip().splitlines()[-1])
  e1 = results["smol"]["experiments"]["E1"]
  assert {k: v["n"] for k, v in e1["cells"].items() if v["n"]} == {
      "ms_grpo h2": 1, "ms_grpo shuffled h2": 1, "gae_lambda0.95 h2": 1}
  assert results["smol"]["runs"] == 3 and results["byte"]["runs"] == 0
  assert results["byte"]["experiments"]["E1"]["verdict"] == "not run"
