"""The code behind the study's records: each record's commit, dirty flag and tree hashes
(records.provenance), and the report's refusal to compare records made by code that differs beyond the
plan's allowed files (versions.CodeCheck, plan.CODE_MAY_DIFFER), on a scratch git repository and on the
committed records."""
import os
import subprocess

import pytest

from experiments.study import plan, records, report, versions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git(repo, *args) -> str:
  return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def scratch(tmp_path):
  """A repository with mtrl_jax/, configs/ and a README, committed twice: the second commit edits
  mtrl_jax/a.py and configs/c.py. Returns (path, {commit: {dir: tree}})."""
  repo = tmp_path / "repo"
  (repo / "mtrl_jax").mkdir(parents=True)
  (repo / "configs").mkdir()
  git(repo, "init", "-q")
  git(repo, "config", "user.email", "t@t")
  git(repo, "config", "user.name", "t")
  (repo / "mtrl_jax" / "a.py").write_text("A = 1\n")
  (repo / "mtrl_jax" / "b.py").write_text("B = 1\n")
  (repo / "configs" / "c.py").write_text("C = 1\n")
  (repo / "README.md").write_text("readme\n")
  (repo / ".gitignore").write_text("*.pyc\n")
  trees = {}
  for n in (1, 2):
    if n == 2:
      (repo / "mtrl_jax" / "a.py").write_text("A = 2\n")
      (repo / "configs" / "c.py").write_text("C = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"v{n}")
    trees[git(repo, "rev-parse", "HEAD")] = {d: git(repo, "rev-parse", f"HEAD:{d}") for d in records.CODE_DIRS}
  return repo, trees


def test_provenance_hashes_the_code_as_it_is_on_disk(scratch):
  """Clean: dirty False and the trees are HEAD's. An edit to mtrl_jax/ (or an untracked file in configs/)
  makes the record dirty with that folder's tree changed; an ignored file, or an edit outside the two
  folders (where records land), does not. Breaks checked: the trees read from HEAD instead of the disk
  (the edited tree equals HEAD's); dirty taken over the whole repository (the README edit reads dirty)."""
  repo, trees = scratch
  head = git(repo, "rev-parse", "HEAD")
  clean = records.provenance(str(repo))
  assert clean == {"commit": head, "dirty": False, "tree": trees[head]}
  (repo / "README.md").write_text("edited\n")
  (repo / "mtrl_jax" / "x.pyc").write_text("ignored")
  assert records.provenance(str(repo)) == clean
  (repo / "mtrl_jax" / "b.py").write_text("B = 2\n")
  edited = records.provenance(str(repo))
  assert edited["dirty"] is True and edited["commit"] == head
  assert edited["tree"]["mtrl_jax"] != trees[head]["mtrl_jax"] and edited["tree"]["configs"] == trees[head]["configs"]
  (repo / "mtrl_jax" / "b.py").write_text("B = 1\n")
  (repo / "configs" / "new.py").write_text("N = 1\n")
  untracked = records.provenance(str(repo))
  assert untracked["dirty"] is True and untracked["tree"]["configs"] != trees[head]["configs"]
  assert git(repo, "status", "--porcelain", "--", "mtrl_jax") == ""  # the scratch index left the real one alone
  assert records.provenance(str(repo / "..")) == {"commit": "unknown", "dirty": None, "tree": None}  # not git


def _fixture_with_trees(tmp_path, trees, odd_cell: str, odd: str) -> str:
  """The report fixture with every run record at the first commit's trees, but `odd_cell`'s: made at the
  first commit too, dirty, its trees those of commit `odd` (a run from uncommitted edits)."""
  import test_report as fx  # tests/experiments is on sys.path under pytest's default import mode
  out = str(tmp_path / "rec")
  fx.write_fixture(out)
  first = next(iter(trees))
  for (cell, _), rec in records.load(out)["runs"].items():
    records.write(out, {**rec, "commit": first, "dirty": cell == odd_cell,
                        "tree": trees[odd if cell == odd_cell else first]})
  return out


@pytest.mark.parametrize("allowed,tested", [
    ((), False),                                            # no allowed file: refused, naming both
    ((("mtrl_jax/*", "why"),), False),                      # configs/c.py still differs
    ((("mtrl_jax/a.py", "why a"), ("configs/*", "why c")), True),  # every differing file allowed
])
def test_the_report_refuses_to_compare_records_whose_code_differs(scratch, tmp_path, monkeypatch, allowed, tested):
  """E4's decoupled cell at h8 run from uncommitted edits (the second commit's code on the first commit),
  every other run from the first commit clean: E4's h8 claim is not tested, naming the files outside the
  allow-list, unless every differing file is allowed; the other claims are tested as in the fixture.
  Breaks checked: versions keyed by the commit alone (a dirty run passes as its commit's: the first two
  cases read "reproduced"); the allow-list ignored (the third case stays refused)."""
  import dataclasses
  import test_report as fx
  repo, trees = scratch
  first, second = trees
  e4 = plan.experiment("E4")
  monkeypatch.setattr(report, "EXPERIMENTS", tuple(dataclasses.replace(e, seeds=fx.SEEDS) for e in plan.EXPERIMENTS))
  rec = _fixture_with_trees(tmp_path, trees, e4.cell("policy 0.95 critic 1.0 h8").name, second)
  out = tmp_path / "STUDY.md"
  res = report.report(rec, str(out), str(tmp_path / "figs"), date="D", figures=False,
                      code=versions.CodeCheck(allowed, repo=str(repo)))
  got = res["experiments"]["E4"]["comparisons"]
  h8 = got["policy 0.95 critic 1.0 h8 > policy 0.95 critic 0.95 h8"]
  if tested:
    assert h8 == "reproduced"
    assert "`configs/c.py` (allowed); `mtrl_jax/a.py` (allowed)" in out.read_text()
  else:
    assert h8.startswith("not tested (the records were made by code that differs beyond the plan's allowed files"), h8
    assert "`configs/c.py`" in h8 and ("`mtrl_jax/a.py`" in h8) == (not allowed)
    assert "**not allowed**" in out.read_text()
  assert got["policy 0.95 critic 1.0 h2 > policy 0.95 critic 0.95 h2"] == "reproduced"  # one code version


def test_records_of_code_this_repository_does_not_hold_are_not_compared(scratch, tmp_path):
  """A record whose trees (or commit) git cannot find: which files differ is unknown, so the comparison is
  refused, saying so; records of one version need no git at all."""
  repo, trees = scratch
  first = next(iter(trees))
  check = versions.CodeCheck((("*", "anything"),), repo=str(repo))
  a = {"commit": first, "tree": trees[first]}
  assert check.refusal([a, a]) is None
  assert check.refusal([{"commit": "fixture"}, {"commit": "fixture"}]) is None
  lost = {"commit": "f" * 40, "tree": {"mtrl_jax": "e" * 40, "configs": "d" * 40}}
  assert "this repository does not hold both" in check.refusal([a, lost])
  assert "this repository does not hold both" in check.refusal([a, {"commit": "f" * 40}])
  assert check.refusal([a, {"commit": first}]) is None  # a commit-only record of the same code: compared


def test_the_committed_records_are_compared_only_through_the_allow_list():
  """The committed records were made at two commits (be2e9bc, 28f5aef); git diff between them touches the
  six files plan.CODE_MAY_DIFFER allows. Without the allow-list, E1's cross-commit claims are refused and
  name those files; with it, they are tested. Break checked: an allowed pattern dropped from the plan
  (the claim is refused, test_committed_study fails too)."""
  got = records.load(os.path.join(REPO, "docs", "study"))
  run_versions = sorted({versions.version(r) for r in got["runs"].values()})
  strict = versions.CodeCheck((), repo=REPO)
  if any(strict.trees(v) is None for v in run_versions):
    pytest.skip(f"this clone lacks the records' commits {[versions.label(v) for v in run_versions]}")
  files = strict.diff(*run_versions)
  assert files and all(versions.CodeCheck(plan.CODE_MAY_DIFFER).why(f) for f in files), files
  assert {p for p, _ in plan.CODE_MAY_DIFFER} == set(files)  # no stale entry either
  e1 = plan.experiment("E1")
  recs = [r for (cell, _), r in got["runs"].items()
          if cell in (e1.cell("ms_grpo h2").name, e1.cell("gae_lambda0.95 h2").name)]
  assert len({versions.version(r) for r in recs}) == 2
  refused = strict.refusal(recs)
  assert refused and all(f"`{f}`" in refused for f in files)
  assert versions.CodeCheck(plan.CODE_MAY_DIFFER).refusal(recs) is None
