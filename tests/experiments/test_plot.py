"""experiments/{plot,sweep,summarize}.py on synthetic metrics; launch/*.sh under DRY_RUN=1."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from experiments import plot, summarize, sweep
from mtrl_jax.metrics import MetricsWriter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(REPO, "launch")



def write_run(workdir, *, steps=6, eval_every=2, final=(0.75, 0.6), tokens_per_step=100.0, start=0):
  """The line pattern of train/run.py: demos, sft (+ eval), rl eval at 0, rl lines, final eval."""
  w = MetricsWriter(str(workdir), tensorboard=False)
  if start == 0:
    w.write(0, "demos", {"demos/sessions": 64})
    w.write(20, "sft", {"sft/loss": 1.0, "eval/success": 0.9})  # not an RL point
    w.write(0, "rl", {"eval/success": 0.0, "eval/return": 0.0, "eval/greedy_success": 0.0})
  for s in range(start + 1, steps + 1):
    rec = {"rollout/success": s / 10, "rollout/return": s / 20, "tokens_seen": s * tokens_per_step,
           "ledger/tokens_generated": 30.0, "ledger/tokens_prefilled": 70.0}
    if s % eval_every == 0:
      ev = {"eval/success": s / steps, "eval/return": s / (2 * steps), "eval/greedy_success": s / (3 * steps)}
      w.write(s, "rl", ev)
      rec.update(ev)
    w.write(s, "rl", rec)
  if final is not None:
    w.write(steps, "eval", {"eval/success": final[0], "eval/return": final[1]})
  return str(workdir)


# ------------------------------------------------------------------ plot
def test_rl_curves_merges_lines_and_maps_steps_to_tokens(tmp_path):
  c = plot.rl_curves(plot.read_records(write_run(tmp_path / "run")))
  assert c["step"] == [0, 1, 2, 3, 4, 5, 6]
  assert c["tokens"] == [0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
  steps, tokens, ys = c["eval/success"]
  assert steps == [0, 2, 4, 6] and tokens == [0.0, 200.0, 400.0, 600.0]  # the sft eval (0.9) is not here
  assert ys == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
  assert c["rollout/return"][0] == [1, 2, 3, 4, 5, 6]
  assert c["final"] == {"step": 6, "tokens": 600.0, "eval/success": 0.75, "eval/return": 0.6}


def test_rl_curves_drops_steps_rewritten_after_resume(tmp_path):
  d = tmp_path / "run"
  write_run(d, steps=5, final=None, tokens_per_step=100.0)      # killed after step 5
  write_run(d, steps=6, start=3, tokens_per_step=1000.0)         # resumed from the step-3 checkpoint
  c = plot.rl_curves(plot.read_records(str(d)))
  assert c["step"] == [0, 1, 2, 3, 4, 5, 6]
  assert c["tokens"][:4] == [0.0, 100.0, 200.0, 300.0] and c["tokens"][4:] == [4000.0, 5000.0, 6000.0]


def test_token_axis_falls_back_to_the_per_step_ledger(tmp_path):
  """Runs whose lines lack a cumulative tokens_seen still get a token axis from the ledger."""
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.write(0, "rl", {"eval/success": 0.0})
  for s in (1, 2, 3):
    w.write(s, "rl", {"rollout/success": 0.5, "tokens_seen": 0.0, "ledger/tokens_generated": 10.0 * s,
                      "ledger/tokens_prefilled": 100.0})
  c = plot.rl_curves(plot.read_records(str(tmp_path)))
  assert c["tokens"] == [0.0, 110.0, 230.0, 360.0]
  assert summarize.tokens_seen([r for r in plot.read_records(str(tmp_path)) if r["stage"] == "rl"]) == 360.0


def test_plot_writes_png_for_one_and_several_runs(tmp_path, capsys):
  one = write_run(tmp_path / "estimator=grpo,seed=0")
  out = plot.main(["--workdir", one])
  assert out == os.path.join(one, "curves.png")
  printed = capsys.readouterr().out.strip().splitlines()
  assert printed[0] == out and json.loads(printed[-1]) == {"out": out, "runs": 1}
  two = write_run(tmp_path / "estimator=rloo,seed=0", final=(0.5, 0.4), tokens_per_step=150.0)
  both = plot.split_workdirs([f"{one},{two}"])  # names with commas still split right
  assert both == [one, two]
  out2 = plot.main(["--workdir", f"{one},{two}", "--out", str(tmp_path / "cmp.png"), "--smooth", "0.5"])
  for path in (out, out2):
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000
  assert plot.default_out([one, two]) == os.path.join(str(tmp_path), "curves.png")
  assert plot._labels(["/a/x/run", "/b/y/run", "/c/z"]) == ["x/run", "y/run", "z"]


def test_plot_cli_and_bad_workdir(tmp_path):
  one = write_run(tmp_path / "a")
  res = subprocess.run([sys.executable, "-m", "experiments.plot", "--workdir",
                        str(tmp_path / "*"), "--out", str(tmp_path / "glob.png")],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  assert res.stdout.strip().splitlines()[0] == str(tmp_path / "glob.png") and os.path.getsize(tmp_path / "glob.png") > 0
  with pytest.raises(SystemExit, match="no workdir matches"):
    plot.split_workdirs([f"{one},{tmp_path}/missing"])


# ------------------------------------------------------------------ summarize
def test_summarize_table_and_json(tmp_path, capsys):
  write_run(tmp_path / "estimator=grpo,seed=0", final=(1.0, 0.8))
  write_run(tmp_path / "estimator=grpo,seed=1", final=(0.5, 0.4))
  write_run(tmp_path / "estimator=rloo,seed=0", final=(0.25, 0.2))
  write_run(tmp_path / "estimator=rloo,seed=1", final=None, steps=3)  # still running
  (tmp_path / "estimator=rloo,seed=1" / "metrics.jsonl").open("a").write('{"step": 4, "sta')  # killed mid-line
  result = summarize.main(["--root", str(tmp_path)])
  out = capsys.readouterr().out
  assert "| estimator=grpo,seed=0 | final | 6 | 600 | 1.000 | 0.800 |" in out
  assert "| estimator=rloo,seed=1 | unfinished | 3 | 300 | — | — |" in out
  assert "| grpo | 2 | 0.750 ± 0.354 | 0.600 ± 0.283 |" in out  # sample std of (1.0, 0.5)
  assert "| rloo | 1 | 0.250 | 0.200 |" in out
  line = json.loads(out.strip().splitlines()[-1])
  assert line == json.loads(json.dumps(result))
  groups = {g["keys"]["estimator"]: g for g in line["groups"]}
  assert groups["grpo"]["n"] == 2 and groups["grpo"]["eval/success/mean"] == pytest.approx(0.75)
  assert groups["rloo"]["runs"] == ["estimator=rloo,seed=0"]


# ------------------------------------------------------------------ sweep
def test_sweep_dry_run_expands_the_grid_and_skips_finished_runs(tmp_path, capsys):
  root = tmp_path / "sweep"
  write_run(root / "estimator=rloo,horizon=6,seed=1")  # has its final eval line
  assert sweep.main(["--config", "configs/grpo.py", "--grid", "estimator=grpo,rloo;horizon=3,6;seed=0,1",
                     "--root", str(root), "--dry_run", "--config.rl.steps=5"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  cmds = [shlex.split(x) for x in lines if not x.startswith("#")]
  assert len(cmds) == 7 and "# skip (final eval present): estimator=rloo,horizon=6,seed=1" in lines
  assert cmds[0] == [sys.executable, "-m", "mtrl_jax.main", "--config=configs/grpo.py:estimator=grpo,horizon=3,seed=0",
                     f"--workdir={root}/estimator=grpo,horizon=3,seed=0", "--config.rl.steps=5"]
  assert cmds[-1][3] == "--config=configs/grpo.py:estimator=rloo,horizon=6,seed=0"
  assert not os.path.exists(root / "estimator=grpo,horizon=3,seed=0")  # a dry run creates nothing
  assert sweep.expand("configs/grpo.py:env=keydoor", "seed=0") == [("seed=0", "configs/grpo.py:env=keydoor,seed=0")]
  for bad in ("seed", "seed=0;seed=1", "seed=0,", "env=a/b"):
    with pytest.raises(ValueError):
      sweep.parse_grid(bad)
  with pytest.raises(SystemExit):
    sweep.main(["--config", "configs/grpo.py:seed=0", "--grid", "seed=1", "--root", str(root), "--dry_run"])


def test_sweep_runs_logs_and_resumes(tmp_path, capsys):
  """A stand-in interpreter writes the final eval line; runs whose config has seed=1 fail once."""
  fake = tmp_path / "fake_python"
  calls = tmp_path / "calls.txt"
  fake.write_text(f"""#!/usr/bin/env bash
echo "$@" >> {calls}
for a in "$@"; do case "$a" in --workdir=*) wd="${{a#--workdir=}}" ;; --config=*) cfg="$a" ;; esac; done
echo "training in $wd"
if [[ "$cfg" == *seed=1* && ! -e "$wd/failed_once" ]]; then touch "$wd/failed_once"; echo boom >&2; exit 3; fi
echo '{{"step": 3, "stage": "eval", "eval/success": 1.0, "eval/return": 1.0}}' >> "$wd/metrics.jsonl"
""")
  fake.chmod(0o755)
  argv = ["--config", "configs/grpo.py", "--grid", "estimator=grpo,rloo;seed=0,1", "--root", str(tmp_path / "r"),
          "--python", str(fake), "--parallel", "2"]
  assert sweep.main(argv) == 1  # the two seed=1 runs failed
  assert len(calls.read_text().splitlines()) == 4
  log = (tmp_path / "r" / "estimator=rloo,seed=1" / "log.txt").read_text()
  assert "=== " in log and "mtrl_jax.main" in log and "boom" in log
  assert sweep.is_done(str(tmp_path / "r" / "estimator=grpo,seed=0"))
  assert sweep.main(argv) == 0  # relaunch: only the failed ones run again
  assert len(calls.read_text().splitlines()) == 6
  assert sweep.main(argv) == 0 and len(calls.read_text().splitlines()) == 6  # all done: nothing runs
  assert "skip (final eval present)" in capsys.readouterr().out


# ------------------------------------------------------------------ launch
def _launch(script, *args, env=None, tmp_path, check=True):
  """Runs launch/<script> with DRY_RUN=1 and a `gcloud` on PATH that fails if it is ever called."""
  fakebin = tmp_path / "bin"
  fakebin.mkdir(exist_ok=True)
  (fakebin / "gcloud").write_text(f"#!/bin/sh\necho called >> {tmp_path}/gcloud_called\nexit 99\n")
  (fakebin / "gcloud").chmod(0o755)
  e = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MTRL_"))}
  e.update({"PATH": f"{fakebin}:{e['PATH']}", "DRY_RUN": "1", "TPU_NAME": "mtrl-test", "ZONE": "europe-west4-a",
            "METADATA": "0", **(env or {})})
  res = subprocess.run(["bash", os.path.join(LAUNCH, script), *args], capture_output=True, text=True,
                       env=e, timeout=30, cwd=tmp_path)
  if check:
    assert res.returncode == 0, res.stderr
  assert not (tmp_path / "gcloud_called").exists(), "DRY_RUN=1 executed gcloud"
  return res


def _gcloud_lines(out, verb):
  return [shlex.split(x[2:]) for x in out.splitlines() if x.startswith(f"+ gcloud compute tpus tpu-vm {verb} ")]


SCRIPTS = ["create.sh", "setup.sh", "run_all.sh", "run_worker.sh", "teardown.sh", "sweep.sh"]


@pytest.mark.parametrize("script", SCRIPTS + ["common.sh"])
def test_launch_scripts_parse_and_are_strict(script):
  path = os.path.join(LAUNCH, script)
  assert subprocess.run(["bash", "-n", path]).returncode == 0
  if script != "common.sh":
    assert "set -euo pipefail" in open(path).read() and os.access(path, os.X_OK)


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_help(script, tmp_path):
  res = _launch(script, "--help", tmp_path=tmp_path)
  assert res.stdout.startswith("usage: launch/")


@pytest.mark.parametrize("script,args,verbs", [
    ("setup.sh", ["--all"], ["scp", "ssh"]),
    ("run_all.sh", ["--config=configs/grpo.py:estimator=rloo,horizon=6", "--workdir=/w/a b", "--config.rl.steps=5"],
     ["scp", "ssh"]),
    ("sweep.sh", ["--config", "configs/grpo.py", "--grid", "estimator=grpo,rloo;seed=0,1", "--root", "/w/s"],
     ["scp", "ssh"]),
    ("teardown.sh", [], ["scp"]),
])
def test_launch_dry_run_reaches_all_workers(script, args, verbs, tmp_path):
  out = _launch(script, *args, tmp_path=tmp_path).stdout
  for verb in verbs:
    (cmd,) = _gcloud_lines(out, verb)
    assert "--worker=all" in cmd and "--zone=europe-west4-a" in cmd
  if "ssh" not in verbs:
    return
  (ssh,) = _gcloud_lines(out, "ssh")
  assert ssh[5] == "mtrl-test"
  remote = shlex.split(next(a for a in ssh if a.startswith("--command="))[len("--command="):])
  if script == "setup.sh":
    assert remote[-2:] == ["bash", "launch/setup.sh"]
    return
  # The job's arguments survive both rounds of quoting unchanged.
  i = remote.index("launch/run_worker.sh")
  assert remote[i + 1:i + 1 + len(args)] == args
  if script == "sweep.sh":
    assert "ENTRY=sweep" in remote and "nohup" in remote  # a sweep detaches by default


def test_create_and_teardown_dry_run(tmp_path):
  (create,) = _gcloud_lines(_launch("create.sh", "--accelerator", "v5litepod-16", "--spot", tmp_path=tmp_path).stdout,
                            "create")
  assert create[5:] == ["mtrl-test", "--zone=europe-west4-a", "--accelerator-type=v5litepod-16",
                        "--version=v2-alpha-tpuv5-lite", "--spot"]
  out = _launch("teardown.sh", "--no_logs", tmp_path=tmp_path).stdout
  assert _gcloud_lines(out, "delete") == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "mtrl-test",
                                           "--zone=europe-west4-a", "--quiet"]]
  assert not _gcloud_lines(out, "scp")
  res = _launch("create.sh", env={"TPU_NAME": ""}, tmp_path=tmp_path, check=False)
  assert res.returncode == 2 and "no TPU name" in res.stderr


def test_run_worker_fills_distributed_flags_and_names_its_log(tmp_path):
  env = {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "SKIP_SETUP": "1"}
  out = _launch("run_worker.sh", "--config=configs/grpo.py", "--workdir=/w", env=env, tmp_path=tmp_path).stdout
  assert f"log {REPO}/logs/worker-2.log" in out
  cmd = shlex.split(next(x for x in out.splitlines() if x.startswith("+ "))[2:])
  assert cmd[1:] == ["-m", "mtrl_jax.main", "--config=configs/grpo.py", "--workdir=/w",
                     "--config.distributed.coordinator_address=h0:8476", "--config.distributed.num_processes=4",
                     "--config.distributed.process_id=2"]
  # Old-style metadata triples, the sweep entry, and one host: no distributed flags.
  env = {"WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "a:0:10.0.0.1,b:1:10.0.0.2", "SKIP_SETUP": "1", "ENTRY": "sweep"}
  out = _launch("run_worker.sh", "--root", "/s", env=env, tmp_path=tmp_path).stdout
  assert "--config.distributed.coordinator_address=10.0.0.1:8476" in out and "-m experiments.sweep" in out
  out = _launch("run_worker.sh", "--workdir=/w", env={"SKIP_SETUP": "1", "LOG_DIR": "/l"}, tmp_path=tmp_path).stdout
  assert "worker 0 of 0 host(s); log /l/worker-0.log" in out and "--config.distributed" not in out
  assert "distributed.auto=true" in _launch("run_worker.sh", env={"SKIP_SETUP": "1", "DIST": "auto"},
                                            tmp_path=tmp_path).stdout


def test_setup_is_idempotent(tmp_path):
  """Against a stand-in venv python: the first run installs and stamps, the second does nothing."""
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  calls = tmp_path / "pip_calls"
  (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
  (venv / "bin" / "python").chmod(0o755)
  env = {"DRY_RUN": "0", "VENV": str(venv)}
  _launch("setup.sh", env=env, tmp_path=tmp_path)
  first = calls.read_text().splitlines()
  assert any(f"-e {REPO}[dev]" in c for c in first) and any(c.endswith("-U jax[tpu]") for c in first)
  assert (venv / ".mtrl_setup_stamp").exists()
  res = _launch("setup.sh", env=env, tmp_path=tmp_path)
  assert calls.read_text().splitlines() == first and "up to date" in res.stderr
  _launch("setup.sh", env={**env, "JAX_SPEC": "jax"}, tmp_path=tmp_path)  # a new spec reinstalls
  assert len(calls.read_text().splitlines()) > len(first)


def test_seed_report_min_median_max_and_the_bar(tmp_path, capsys):
  """Catches: the median of an even count taken as one middle value, a run that
  reached the bar and fell back reported by its final eval only, an unfinished
  run counted in min/median/max, and --seeds not expanding to seed=0..N-1."""
  def run(name, evals, final):
    wd = tmp_path / name
    wd.mkdir()
    lines = [{"step": s, "stage": "rl", "eval/success": v} for s, v in evals]
    if final is not None:
      lines.append({"step": evals[-1][0], "stage": "eval", "eval/success": final})
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return name, str(wd)

  runs = [run("seed=0", [(0, 0.5), (10, 0.96), (20, 0.80), (30, 0.97)], 0.98),
          run("seed=1", [(0, 0.4), (10, 0.7), (20, 0.95)], 0.96),
          run("seed=2", [(0, 0.5), (10, 0.6)], 0.70),
          run("seed=3", [(0, 0.5), (10, 0.9)], 1.0),
          run("seed=4", [(0, 0.5)], None)]  # unfinished
  rep = sweep.seed_report(runs, bar=0.95)
  assert rep["finished"] == 4 and rep["runs"] == 5
  assert rep["eval_success"] == {"min": 0.70, "median": pytest.approx(0.97), "max": 1.0}
  assert rep["per_run"]["seed=0"] == {"final": 0.98, "first_at_bar": 10, "min_after_bar": 0.80}
  assert rep["per_run"]["seed=1"]["first_at_bar"] == 20 and rep["per_run"]["seed=1"]["min_after_bar"] == 0.95
  assert rep["per_run"]["seed=2"]["first_at_bar"] is None and not rep["all_reached_bar"]
  assert rep["per_run"]["seed=3"]["first_at_bar"] == "final"  # reached it only at the final eval
  sweep.print_seed_report(rep)
  assert "min 0.700, median 0.970, max 1.000" in capsys.readouterr().out
  assert sweep.main(["--config", "configs/default.py", "--seeds", "3", "--root", str(tmp_path / "r"),
                     "--dry_run"]) == 0
  cmds = [x for x in capsys.readouterr().out.splitlines() if not x.startswith("#")]
  assert [c.split("--config=")[1].split()[0] for c in cmds] == [f"configs/default.py:seed={i}" for i in range(3)]
