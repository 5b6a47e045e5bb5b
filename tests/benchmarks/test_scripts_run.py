"""Every script in benchmarks/ and experiments/ runs the way a user runs it.

`python benchmarks/X.py ...` (a script of a plain folder) or `python -m
experiments.X ...` (a module of the experiments package, or a package's
`__main__.py`) from the repository root, in a fresh empty workdir, at its smallest size, in a subprocess with a clean environment (one
CPU device, not the suite's 8 fake ones): it must exit 0 and print its JSON
line last. Importing a script's functions (what the other tests do) cannot
see what only running it shows: a script's folder comes first on sys.path, so
a script named like a library (`benchmarks/tree.py` was found by
tensorflow-datasets' `import tree`, and every benchmark that built demos in
a fresh workdir died) breaks every script beside it.

Breaks checked (issue 27): restoring `benchmarks/tree.py` (a copy of
tree_rollouts.py under the old name) fails
`test_no_script_shadows_an_importable_module` and the async_rl run (its demo
build dies in tensorflow_datasets with "module 'tree' has no attribute
'map_structure'"); a new script with a `__main__` block but no row below
fails `test_every_script_is_covered`.
"""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT_DIRS = ("benchmarks", "experiments", "launch")

# script -> (arguments at its smallest size; "{w}" is a fresh workdir, "{d}" an empty folder), slow?
# Scripts that need another script's output get it in `test_sweep_summarize_plot`
# and `test_report_on_a_study_root` instead.
RUNS = {
    "benchmarks/attention.py": (["--times", "64", "--mems", "128", "--reps", "1", "--block", "32"], False),
    "benchmarks/scan_compile.py": (["--layers", "2", "--dim", "32", "--length", "16", "--decode_slots", "16",
                                    "--batch", "1"], False),
    "benchmarks/sampler.py": (["--batch", "2", "--prompt", "8", "--new", "4", "--reps", "1",
                               "--nocache_reps", "1", "--turns", "2", "--obs", "4", "--act", "4"], False),
    "benchmarks/learner.py": (["--layers", "1", "--seqs", "128"], True),
    "benchmarks/async_rl.py": (["--workdir", "{w}", "--seeds", "0", "--updates", "2", "--eval_every", "1",
                                "--eval_tasks", "8", "--sft_steps", "5", "--warmup", "0", "--actors", "2",
                                "--tasks", "2", "--group", "2"], True),
    "experiments/study/__main__.py": (["--root", "{w}", "--only", "E1", "--seeds", "1", "--dry_run"], False),
    "experiments/study/readme.py": (["--check"], False),
    # issue 43's table from its committed records (the runs themselves: tests/train/test_critic_probe_slow.py)
    "experiments/critic_probe.py": (["--out", "docs/critic_probe", "--report"], False),
    "experiments/study/pilot3.py": (["--out", "{w}", "--table"], False),  # the table of an empty pilot folder
    # round 3's graded part from an empty record folder (every claim 'not tested'); the numbers: test_graded.py
    "experiments/study/graded.py": (["--records", "{d}"], False),
    "experiments/study/machines.py": (["--b", "docs/study3_replica", "--out", "{d}/COMPARISON.md"], False),
    # the per-file profile of a recorded quick-tier log (the tier itself takes 10 minutes)
    "benchmarks/quick_tier.py": (["--log", "tests/benchmarks/quick_tier_sample.txt", "--out", "{d}/profile.json"],
                                 False),
    "benchmarks/rollout.py": (["--tasks", "2", "--group", "2", "--rows", "2", "--reps", "1", "--dim", "32",
                               "--layers", "1", "--max_turns", "2", "--budget", "16", "--latency_ms", "1",
                               "--prompt_chars", "40"], True),
    # the memory part at one layer (the update and sampler parts build SmolLM2's full 30-layer shape)
    "benchmarks/lora_bench.py": (["--parts", "memory", "--seq", "256", "--layers", "1"], True),
    # its numbers are checked in process, quick tier: tests/benchmarks/test_bf16_mismatch.py
    "benchmarks/bf16_mismatch.py": (["--tiny", "--turns", "1", "--new", "4"], True),
    # one run each of the three ways (--n 2 took 499 s of the slow tier; the reuse itself is
    # tested in tests/experiments/test_inprocess_runs.py)
    "benchmarks/many_runs.py": (["--n", "1"], True),
    # slow: every probe's ceiling, sokoban's room generation most of it (63 s of the quick tier at
    # load 10); the command in process on two probes, quick tier:
    # tests/experiments/test_report.py::test_ceilings_command_writes_a_record_per_probe_and_prints_them
    "experiments/study/records.py": (["--ceilings", "--out", "{w}"], True),
}
# Run from a copy of the repository: mutmut writes mutants/ into the folder it runs in.
MUTATION = ["aaw", "--tests", "tests/credit/test_aaw.py", "--max-examples", "1"]
# A module outside credit/ with its default tests (no JAX: a forked child per mutant).
MUTATION_QUEUE = ["rollout/staleness_queue", "--only", "*group_min_version*"]
CHAINED = {"experiments/sweep.py", "experiments/summarize.py", "experiments/plot.py", "experiments/study/report.py",
           "benchmarks/mutation.py",
           # run the same way (subprocess, fresh workdir, JSON keys checked) in its own test:
           # tests/benchmarks/test_tree_bench.py::test_tree_benchmark_json_line
           "benchmarks/tree_rollouts.py",
           # needs the converted real model: `test_pretrained_memory_on_the_real_model` below
           "benchmarks/pretrained_memory.py",
           # the accelerator run's helpers: run by benchmarks/device_check.sh in
           # tests/benchmarks/test_device_check.py, split/join in test_weights_transfer.py
           "benchmarks/weights_transfer.py", "benchmarks/device_report.py"}


def user_env() -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
  env["JAX_PLATFORMS"] = "cpu"
  # One device; LLVM level 0 as the suite compiles (tests/conftest.py): what these runs check (the
  # script starts from its folder, exits 0, prints its JSON line) does not depend on it.
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  return env


def invocation(script: str) -> list[str]:
  """How a user runs it: a module of a package (a folder with __init__.py) with `-m`, else by its path."""
  folder, name = os.path.split(script)
  if not os.path.exists(os.path.join(REPO, folder, "__init__.py")):
    return [sys.executable, script]
  module = folder.replace("/", ".") if name == "__main__.py" else f"{folder.replace('/', '.')}.{name[:-3]}"
  return [sys.executable, "-m", module]


def run_script(script: str, args: list[str], cwd: str = REPO, timeout: int = 1200) -> dict:
  p = subprocess.run([*invocation(script), *args], cwd=cwd, env=user_env(), capture_output=True,
                     text=True, timeout=timeout)
  assert p.returncode == 0, f"{script} exited {p.returncode}:\n{p.stderr[-4000:]}"
  last = p.stdout.strip().splitlines()[-1]
  return json.loads(last)


def _is_package(d: str) -> bool:
  return os.path.exists(os.path.join(REPO, d, "__init__.py"))


def scripts() -> list[str]:
  """Every .py file with a `__main__` block, and every package's `__main__.py`, in the script folders
  (a package's subpackages included)."""
  out = []
  for d in SCRIPT_DIRS:
    for root, dirs, files in sorted(os.walk(os.path.join(REPO, d))):
      rel = os.path.relpath(root, REPO)
      dirs[:] = sorted(x for x in dirs if _is_package(os.path.join(rel, x)))  # only a package's own packages
      for f in sorted(files):
        if f.endswith(".py") and (f == "__main__.py" or '__name__ == "__main__"' in open(os.path.join(root, f)).read()):
          out.append(f"{rel}/{f}")
  return out


def test_no_script_shadows_an_importable_module():
  """A module in a plain script folder, or a script package itself, named like a stdlib module or an
  installed top-level package (a package's own modules are run with -m from the repository root: their
  folder is never first on sys.path)."""
  installed = {m.name for m in pkgutil.iter_modules() if not os.path.abspath(str(getattr(m.module_finder, "path",
                                                                                          ""))).startswith(REPO)}
  taken = installed | set(sys.stdlib_module_names)
  bad = [f"{d}/{f}" for d in SCRIPT_DIRS if os.path.isdir(os.path.join(REPO, d)) and not _is_package(d)
         for f in os.listdir(os.path.join(REPO, d)) if f.endswith(".py") and f[:-3] in taken]
  bad += [d for d in SCRIPT_DIRS if _is_package(d) and d in taken]
  assert not bad, f"these scripts shadow an importable module of the same name: {bad}"


def test_every_script_is_covered():
  missing = [s for s in scripts() if s not in RUNS and s not in CHAINED]
  assert not missing, f"scripts without a run in this test: {missing}"


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if slow else s
                                    for s, (_, slow) in RUNS.items()])
def test_script_runs_from_a_fresh_workdir(script, tmp_path):
  args = [a.replace("{w}", str(tmp_path / "work")).replace("{d}", str(tmp_path)) for a in RUNS[script][0]]
  out = run_script(script, args)
  assert isinstance(out, dict) and out


def _repo_copy(tmp_path):
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
  copy = tmp_path / "repo"
  for f in files:
    src = os.path.join(REPO, f)
    if os.path.isfile(src):
      dst = copy / f
      dst.parent.mkdir(parents=True, exist_ok=True)
      dst.write_bytes(open(src, "rb").read())
  return copy


@pytest.mark.slow
def test_mutation_runs_in_a_fresh_copy(tmp_path):
  """benchmarks/mutation.py on the smallest credit file, in a copy of the repository (as a clean clone)."""
  out = run_script("benchmarks/mutation.py", MUTATION, cwd=str(_repo_copy(tmp_path)))
  counts = out["per_file"]["mtrl_jax/credit/aaw.py"]
  assert counts.get("killed", 0) > 0 and out["isolation"] == "inprocess"


def test_mutation_of_the_staleness_queue_forks_a_child_per_mutant(tmp_path):
  """A target outside credit/ by its path, with its DEFAULT_TESTS: the five mutants of
  group_min_version are all killed, each in a forked child (the queue's tests never start JAX).
  About 15 s: the quick tier's check of benchmarks/mutation.py."""
  out = run_script("benchmarks/mutation.py", MUTATION_QUEUE, cwd=str(_repo_copy(tmp_path)))
  assert out["isolation"] == "fork"
  assert out["tests"] == ["tests/rollout/test_staleness_queue.py", "tests/rollout/test_staleness_queue_exact.py"]
  counts = out["per_file"]["mtrl_jax/rollout/staleness_queue.py"]
  assert counts.get("killed", 0) == 5 and "survived" not in counts


@pytest.mark.slow
def test_sweep_summarize_plot(tmp_path):
  """A one-run sweep of the main job's smoke size, then the scripts that read it."""
  root = tmp_path / "sweep"
  out = run_script("experiments/sweep.py", ["--config", "configs/default.py:runlocal=true", "--grid", "seed=0",
                                            "--root", str(root), "--config.rl.steps=2", "--config.sft.steps=5",
                                            "--config.eval.tasks=4"])
  assert out["finished"] == 1 and out["failed"] == 0
  summary = run_script("experiments/summarize.py", ["--root", str(root)])
  assert summary
  plotted = run_script("experiments/plot.py", ["--workdir", str(root / "seed=0")])
  assert os.path.exists(plotted["out"])


def test_report_on_a_study_root(tmp_path):
  """The study's report as a user runs it (python -m experiments.study.report), over a folder of synthetic
  per-run records (the committed fixture's writer; the records of real runs are written by the study's
  runner, tested elsewhere)."""
  sys.path.insert(0, os.path.join(REPO, "tests", "experiments"))
  from test_report import write_fixture  # noqa: E402
  write_fixture(str(tmp_path / "records"))
  out = run_script("experiments/study/report.py", ["--records", str(tmp_path / "records"), "--out",
                                       str(tmp_path / "docs" / "STUDY.md"), "--figdir", str(tmp_path / "figs")])
  text = (tmp_path / "docs" / "STUDY.md").read_text()
  assert out["runs"] > 0 and out["experiments"], out
  assert "Holm" in text, text[:2000]


@pytest.mark.slow
def test_pretrained_memory_on_the_real_model(smollm2_2layer):
  """benchmarks/pretrained_memory.py as a user runs it, on SmolLM2 cut to 2 blocks."""
  out = run_script("benchmarks/pretrained_memory.py", ["--hf_dir", smollm2_2layer, "--remat", "dots",
                                                       "--tokens", "32", "--batch", "1"])
  assert isinstance(out, dict) and out
