"""benchmarks/quick_tier.py reads a pytest --durations=0 output into per-file and per-folder seconds.

The run itself (the whole quick tier) is what the tool times, so these tests read a small recorded log
(quick_tier_sample.txt, lines in pytest's own format) instead; test_scripts_run.py runs the script the
way a user does on the same log.
"""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quick_tier_sample.txt")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import quick_tier  # noqa: E402


def test_parse_sums_setup_call_and_teardown_per_file_and_reads_the_counts():
  """Break checked: counting only `call` lines gives test_textworld.py 9.27 instead of 57.42 (the session
  fixture's 47.90 s setup is where a fresh machine's game builds show); a regex that keeps the test id
  gives one row per test, not per file."""
  got = quick_tier.parse(open(SAMPLE).read())
  assert got["files"] == pytest.approx({"tests/envs/test_textworld.py": 47.90 + 9.27 + 0.25,
                                        "tests/benchmarks/test_scripts_run.py": 17.59,
                                        "tests/test_import_graph.py": 2.10, "tests/credit/test_gae.py": 0.50})
  assert got["counts"] == {"passed": 1609}


def test_folders_group_files_and_a_top_level_test_file_is_its_own_row():
  """Break checked: folder_of keeping only the first path part puts every row under `tests`."""
  got = quick_tier.by_folder(quick_tier.parse(open(SAMPLE).read())["files"])
  assert list(got) == ["tests/envs", "tests/benchmarks", "tests/test_import_graph.py", "tests/credit"]
  assert got["tests/envs"] == pytest.approx(57.42)


def test_an_output_without_durations_is_refused_by_name():
  with pytest.raises(ValueError, match="--durations=0"):
    quick_tier.parse("1609 passed in 642.57s\n")


def test_profile_written_and_compared(tmp_path, capsys):
  """A profile written with --out, then a log compared against it: the JSON line carries both totals and
  the table each folder's change. Break checked: `was` read from the new profile prints +0.0 for every
  folder; the profile not written fails the load."""
  old = tmp_path / "old.json"
  quick_tier.main(["--log", SAMPLE, "--out", str(old), "--commit", "abc1234", "--machine", "test box"])
  prof = json.loads(old.read_text())
  assert prof["commit"] == "abc1234" and prof["machine"] == "test box" and prof["counts"]["passed"] == 1609
  prof["files"]["tests/envs/test_textworld.py"] = 7.42  # the earlier run: 50 s less in that file
  old.write_text(json.dumps(prof))
  capsys.readouterr()
  quick_tier.main(["--log", SAMPLE, "--compare", str(old)])
  out = capsys.readouterr().out.strip().splitlines()
  line = json.loads(out[-1])
  assert line["test_s"] == pytest.approx(77.6) and line["test_s_was"] == pytest.approx(27.6)
  envs_row = next(r for r in out if r.endswith("  tests/envs"))
  assert envs_row.split()[:3] == ["57.4", "7.4", "+50.0"]
