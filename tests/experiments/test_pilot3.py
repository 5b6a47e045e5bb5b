"""experiments/study/pilot3.py: the pilot's commands and its table from run folders."""
import json

from experiments.study import pilot3


def test_commands_are_round_3_cells_and_the_table_reads_the_first_and_last_eval(tmp_path):
  """Each pilot run is a configs/study.py cell with the cue and seeded draws; the table reports the step-0
  and the last RL eval (success and the share following the sign) and the last update's invalid turns.
  Breaks checked: the table reading the final `eval` stage's row as step 0 (rows filtered by stage
  dropped) fails the step-0 numbers; cue=true dropped from the command fails the cell check."""
  from configs.study import get_config
  name, h, seed, args, extra = pilot3.RUNS[1]
  cmd = pilot3.command(name, h, seed, args, extra, str(tmp_path), "INIT")
  cell = next(x for x in cmd if x.startswith("--config=")).split(":", 1)[1]
  c = get_config(cell)
  assert c.env.kwargs.cue is True and c.env.kwargs.draw_seed == seed and c.rl.shuffle_scope == "decision"
  wd = tmp_path / name
  wd.mkdir()
  rows = [{"stage": "eval", "step": 32, "eval/success": 0.9, "eval/decision_cued": 0.9},
          {"stage": "rl", "step": 0, "eval/success": 0.5, "eval/decision_cued": 0.25},
          {"stage": "rl", "step": 1, "ledger/invalid_actions": 2.0, "ledger/turns": 64.0},
          {"stage": "rl", "step": 32, "eval/success": 0.75, "eval/decision_cued": 0.625},
          {"stage": "eval", "step": 32, "eval/success": 0.75, "eval/decision_cued": 0.625}]
  (wd / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  (wd / "times.json").write_text(json.dumps({"wall_s": 70.4, "cpu_s": 31.6}))
  row = pilot3.table(str(tmp_path)).splitlines()[-1]
  assert row == f"| {name} | 2 | 0 | 0.500 (0.250) | 0.750 (0.625) at 32 | 0.031 | 70 / 32 |"


def test_only_runs_the_named_runs_and_names_an_unknown_one(tmp_path, monkeypatch):
  """`--only NAME` runs just the named runs among those with a warm start; an unknown name fails before
  any run, naming itself. Break checked: the `only` filter dropped from the loop runs all 8 of seed 2's."""
  import pytest
  ran = []
  monkeypatch.setattr(pilot3.subprocess, "run", lambda cmd, check: ran.append(cmd[4]) or os_mkdir(cmd))
  pilot3.run(str(tmp_path), {(2, 2): "INIT"}, ("h2_s2_gae_q1", "h2_s2_ms_grpo_q0.25"))
  assert [x.rsplit("/", 1)[-1] for x in ran] == ["h2_s2_ms_grpo_q0.25", "h2_s2_gae_q1"]
  with pytest.raises(ValueError, match="h2_s9_gae"):
    pilot3.run(str(tmp_path), {(2, 2): "INIT"}, ("h2_s9_gae",))


def os_mkdir(cmd):
  """The run folder a real run would leave (times.json and done are written into it)."""
  import os
  os.makedirs(cmd[4].split("=", 1)[1], exist_ok=True)
