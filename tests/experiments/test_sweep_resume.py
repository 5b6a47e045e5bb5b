"""experiments/sweep.py x resume: a run killed after an eval and resumed from
an earlier checkpoint rewrites that eval step, and the seed report must read
the rewritten value (issue 34).

The sweep test in test_plot.py writes each step once, so it cannot tell the
killed attempt's value from the resumed one.
"""
import json
import os

from experiments import sweep

# The line pattern of train/run.py's RL stage: an eval every 10 steps on the step's line,
# then the final `eval` stage. The first attempt is killed after its step-20 eval; the
# relaunch resumes from the step-10 checkpoint and writes steps 20 and 30 again.
KILLED = [(0, 0.20), (10, 0.96), (20, 0.96)]
RESUMED = [(20, 0.70), (30, 0.97)]
FINAL = 0.98


def _fake_python(tmp_path):
  """A stand-in for `python -m mtrl_jax.main`: the first call per workdir writes the killed
  attempt's lines and fails, the second the resumed attempt's lines and the final eval."""
  def lines(points):
    return "".join(json.dumps({"step": s, "stage": "rl", "eval/success": v, "train/return": 0.0}) + "\n"
                   for s, v in points)
  (tmp_path / "killed.jsonl").write_text(lines(KILLED) + '{"step": 21, "stage": "rl", "train/ret')  # torn line
  (tmp_path / "resumed.jsonl").write_text(
      "\n" + lines(RESUMED) + json.dumps({"step": 30, "stage": "eval", "eval/success": FINAL}) + "\n")
  fake = tmp_path / "fake_python"
  fake.write_text(f"""#!/usr/bin/env bash
for a in "$@"; do case "$a" in --workdir=*) wd="${{a#--workdir=}}" ;; esac; done
if [[ ! -e "$wd/killed_once" ]]; then
  touch "$wd/killed_once"; cat {tmp_path}/killed.jsonl >> "$wd/metrics.jsonl"; exit 137
fi
cat {tmp_path}/resumed.jsonl >> "$wd/metrics.jsonl"
""")
  fake.chmod(0o755)
  return fake


def test_a_resumed_runs_rewritten_eval_step_replaces_the_killed_attempts(tmp_path, capsys):
  """Seed killed after its step-20 eval (0.96) and resumed from step 10: the
  relaunched sweep's report reads step 20 as 0.70, so the lowest eval after
  first reaching the bar 0.95 (at step 10) is 0.70, and the curve is
  [(0, 0.2), (10, 0.96), (20, 0.7), (30, 0.97)] with final 0.98.

  Bug caught (issue 34, checked on a scratch edit): eval_curve keeping the
  first value written for a step (`curve.setdefault(step, value)`): step 20
  reads 0.96 and min_after_bar 0.96 instead of 0.70; both asserts fail.
  """
  fake = _fake_python(tmp_path)
  root = tmp_path / "root"
  argv = ["--config", "configs/grpo.py", "--grid", "seed=0", "--root", str(root), "--python", str(fake),
          "--bar", "0.95"]
  assert sweep.main(argv) == 1  # killed
  capsys.readouterr()
  assert sweep.main(argv) == 0  # resumed to the end
  rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  row = rep["per_run"]["seed=0"]
  assert row == {"final": FINAL, "first_at_bar": 10, "min_after_bar": 0.70}
  assert rep["eval_success"] == {"min": FINAL, "median": FINAL, "max": FINAL}
  curve, final = sweep.eval_curve(str(root / "seed=0"))
  assert curve == [(0, 0.20), (10, 0.96), (20, 0.70), (30, 0.97)] and final == FINAL
  assert sweep.main(argv) == 0  # done: skipped, the same report
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["per_run"]["seed=0"] == row
