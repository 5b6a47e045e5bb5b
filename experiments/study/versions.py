"""Which code made each record, and whether records of two cells may be compared.

A record carries the commit it was made at (records.provenance); records written since the field
existed also carry `tree`, the git tree hashes of mtrl_jax/ and configs/ as they were on disk at the
run, and `dirty` (those trees differ from the commit's). A record's code version is its trees where it
has them, else its commit: a record from before the trees is taken at its commit (that its run's tree
was clean was not recorded).

The report compares two cells only when every run record of both was made by one code version, or by
versions whose differences all lie in files the plan allows to differ (plan.CODE_MAY_DIFFER: a file
pattern and the reason); otherwise the comparison is "not tested", naming the files. The files two
versions differ in come from git (the trees', or the commits' trees', diff restricted to mtrl_jax/
and configs/), so the repository must hold both versions' objects (a full clone holds every
commit's; a dirty tree's objects are only where its run wrote them). What git said is kept beside the
records (`code_diffs.json`, written by the report, committed with them), so a shallow clone or an
archive without the history regenerates the same report; where neither git nor that file can tell,
the comparison is refused and says so.
"""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess

from experiments.study.records import CODE_DIRS, REPO


def version(rec: dict) -> tuple:
  """("tree", mtrl_jax tree, configs tree) when the record has both, else ("commit", sha)."""
  tree = rec.get("tree") or {}
  if all(tree.get(d) for d in CODE_DIRS):
    return ("tree", *(tree[d] for d in CODE_DIRS))
  return ("commit", rec.get("commit") or "unknown")


def label(v: tuple) -> str:
  if v[0] == "commit":
    return f"commit {v[1][:7]}"
  return "trees " + ", ".join(f"{d}/ {t[:7]}" for d, t in zip(CODE_DIRS, v[1:]))


class CodeCheck:
  """The plan's allowed differences and the git diffs between code versions (each pair asked once)."""

  def __init__(self, allowed=(), repo: str = REPO, cache: str | None = None,
               where: str = "experiments/study/plan.py `CODE_MAY_DIFFER`"):
    self.allowed = tuple(allowed)  # (file pattern, why it may differ)
    self.where = where  # where `allowed` is defined, as the report names it
    self.repo = repo
    self._diffs: dict = {}
    # `cache`: a JSON file of the diffs git gave before ("v1 .. v2" -> files), read first and added to.
    self.cache = cache
    self._known: dict = {}
    if cache and os.path.exists(cache):
      with open(cache) as f:
        self._known = json.load(f)

  @staticmethod
  def _key(v1: tuple, v2: tuple) -> str:
    return ":".join(v1) + " .. " + ":".join(v2)

  def _git(self, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=self.repo, capture_output=True, text=True, check=True).stdout

  def trees(self, v: tuple) -> tuple | None:
    """The version's tree per CODE_DIRS, or None when this repository does not have them."""
    try:
      ids = v[1:] if v[0] == "tree" else tuple(self._git("rev-parse", "--verify", "-q", f"{v[1]}^{{commit}}:{d}").strip()
                                               for d in CODE_DIRS)
      for t in ids:
        self._git("cat-file", "-e", f"{t}^{{tree}}")
      return tuple(ids)
    except (OSError, subprocess.CalledProcessError):
      return None

  def diff(self, v1: tuple, v2: tuple) -> list[str] | None:
    """The files (repository paths) that differ between two versions' code, or None when git cannot tell."""
    key = (v1, v2)
    if key not in self._diffs:
      known = self._known.get(self._key(v1, v2))
      t1, t2 = (None, None) if known is not None else (self.trees(v1), self.trees(v2))
      if known is not None:
        self._diffs[key] = sorted(known)
      elif t1 is None or t2 is None:
        self._diffs[key] = None
      else:
        self._diffs[key] = sorted(f"{d}/{f}" for d, a, b in zip(CODE_DIRS, t1, t2) if a != b
                                  for f in self._git("diff-tree", "-r", "--name-only", a, b).splitlines())
        self._store(self._key(v1, v2), self._diffs[key])
    return self._diffs[key]

  def _store(self, key: str, files: list[str]) -> None:
    """Keeps what git said in the cache file (when there is one), for a checkout without the history."""
    if not self.cache:
      return
    self._known[key] = files
    with open(self.cache, "w") as f:
      json.dump(self._known, f, indent=1, sort_keys=True)
      f.write("\n")

  def why(self, path: str) -> str | None:
    """The plan's reason this file may differ, or None."""
    return next((reason for pattern, reason in self.allowed if fnmatch.fnmatch(path, pattern)), None)

  def refusal(self, recs) -> str | None:
    """Why these run records may not be compared (their code differs beyond the allowed files), or None."""
    versions = sorted({version(r) for r in recs})
    problems = []
    for v in versions[1:]:
      files = self.diff(versions[0], v)
      if files is None:
        problems.append(f"{label(versions[0])} vs {label(v)}: this repository does not hold both, so which "
                        "files differ is unknown")
      elif bad := [f for f in files if self.why(f) is None]:
        problems.append(f"{label(versions[0])} vs {label(v)}: " + ", ".join(f"`{f}`" for f in bad))
    if not problems:
      return None
    return ("the records were made by code that differs beyond the plan's allowed files ("
            + "; ".join(problems) + ")")

  def section(self, got: dict) -> str:
    """STUDY.md's account of the code behind the records: the versions, how the runs' versions differ, and
    the plan's allowed differences with their reasons."""
    kinds = ("runs", "critics", "warm", "ceilings")
    count: dict = {}
    dirty: dict = {}
    for kind in kinds:
      for rec in got[kind].values():
        v = version(rec)
        count.setdefault(v, dict.fromkeys(kinds, 0))[kind] += 1
        dirty.setdefault(v, set()).add(rec.get("dirty"))
    said = {None: "not recorded", True: "yes", False: "no"}
    rows = [[label(v), *(n[k] for k in kinds), ", ".join(said[d] for d in sorted(dirty[v], key=str))]
            for v, n in sorted(count.items())]
    run_versions = sorted({version(r) for r in got["runs"].values()})
    diffs = []
    for v in run_versions[1:]:
      files = self.diff(run_versions[0], v)
      if files is None:
        diffs.append(f"- {label(run_versions[0])} vs {label(v)}: not in this repository (comparisons across "
                     "them are not tested)")
      else:
        diffs.append(f"- {label(run_versions[0])} vs {label(v)}: " + ("no file" if not files else "; ".join(
            f"`{f}` ({'allowed' if self.why(f) else '**not allowed**: comparisons across them are not tested'})"
            for f in files)))
    allowed = "\n".join(f"| `{pattern}` | {reason} |" for pattern, reason in self.allowed)
    return "\n".join([
        "Every record names the commit it was made at; records written since they existed also hold the git "
        "tree hashes of `mtrl_jax/` and `configs/` as they were on disk at the run, and whether those differed "
        "from the commit (dirty). A record without trees is taken at its commit (that its tree was clean was "
        "not recorded). Two cells are compared only when all their run records come from one code version, or "
        "from versions that differ only in files the plan allows (below, with why); otherwise the comparison "
        "is not tested, and says which files differ.", "",
        "| code | runs | critics | warm starts | ceilings | dirty |", "|---|---|---|---|---|---|",
        *("| " + " | ".join(map(str, r)) + " |" for r in rows), "",
        "The runs' code versions against the first (git diff of `mtrl_jax/` and `configs/` between them):", "",
        *(diffs or ["- one version: nothing to check"]), "",
        f"Files allowed to differ between compared records ({self.where}):", "",
        "| file | why it may differ |", "|---|---|", allowed or "| — | none |"])
