"""Round 3's machine kinds (amendment 1, docs/STUDY_ROUND3.md): whole seed blocks from more than one machine.

A start rebuilt on another CPU kind can be another start (starts.py), so a paired difference is only a
paired difference when both runs come from one machine and one start. Amendment 1 lets a second machine
kind add seeds under that rule: a **block** (one horizon at one seed: every cell there) is made on one kind,
from that kind's own starts, recorded in that kind's folder (round3.MACHINE_KINDS). The first kind to record
a run in a block owns it (`owned_elsewhere` says which runs a folder may not take), and the report pools
every kind's runs (`load_all`), keeping each kind's critics apart (its "kinds") so that a critic's
state is judged on every start the runs began from.
"""
from __future__ import annotations

import os
import re

from experiments.study import records
from experiments.study.round3 import MACHINE_KINDS


def folders(repo: str | None = None) -> list[str]:
  """Each kind's records folder (absolute), the round's own first (`repo`: the repository, records.REPO)."""
  repo = repo or records.REPO
  return [os.path.join(repo, rel) for rel, _ in MACHINE_KINDS]


def kind_of(out: str, repo: str | None = None) -> str | None:
  """The kind's name whose folder `out` is, or None (a folder outside the registry: the replica, a scratch one)."""
  for (_, label), path in zip(MACHINE_KINDS, folders(repo)):
    if os.path.abspath(out) == os.path.abspath(path):
      return label
  return None


def horizon_of(cell: str) -> int:
  """The horizon in a cell's name (`...,horizon=8,...`)."""
  m = re.search(r"(?:^|,)horizon=(\d+)(?:,|$)", cell)
  if not m:
    raise ValueError(f"cell {cell!r} names no horizon")
  return int(m.group(1))


def blocks(out: str) -> set[tuple[int, int]]:
  """(horizon, seed) of every run recorded in `out`."""
  return {(horizon_of(cell), seed) for cell, seed in records.load(out)["runs"]}


def owned_elsewhere(names, out: str, repo: str | None = None) -> dict[str, str]:
  """run name ('<cell>,seed=<s>') -> the other kind's folder (relative) that owns its block, for the runs of
  `names` that records folder `out` may not take. Empty when `out` is not a registered kind's folder (a
  replica or scratch folder repeats blocks on purpose and is in no verdict)."""
  if kind_of(out, repo) is None:
    return {}
  owner = {}
  for (rel, _), path in zip(MACHINE_KINDS, folders(repo)):
    if os.path.abspath(path) != os.path.abspath(out):
      for b in blocks(path):
        owner.setdefault(b, rel)
  out_of = {}
  for n in names:
    cell, _, seed = n.rpartition(",seed=")
    if (rel := owner.get((horizon_of(cell), int(seed)))):
      out_of[n] = rel
  return out_of


def pooled_dirs(records_dir: str, also=None) -> list[str]:
  """The folders a round-3 report reads: `records_dir` and `also`, or by default (also None) every other
  registered kind's existing folder when `records_dir` is the round's own, else `records_dir` alone."""
  if also is None:
    own = os.path.abspath(records_dir) == os.path.abspath(folders()[0])
    also = [d for d in folders()[1:] if os.path.isdir(d)] if own else []
  return [records_dir, *also]


def load_all(repo: str | None = None, dirs=None) -> dict:
  """records.load over every kind's folder (`dirs`: these folders instead, the round's own first): the runs of
  all of them, each record with its kind's folder under `_kind`; the first folder's warm, critic and ceiling
  records as records.load gives them, and every folder's critics under "kinds" ({folder: {(warm, seed): rec}}).
  A block found in two folders is an error: the amendment gives a block one machine."""
  repo = repo or records.REPO
  dirs = list(dirs) if dirs is not None else folders(repo)
  got = [records.load(d) for d in dirs]
  out = {**got[0], "runs": {}, "kinds": {}, "folders": {}}
  owner: dict[tuple[int, int], str] = {}
  for d, g in zip(dirs, got):
    rel = os.path.relpath(d, repo)
    out["kinds"][rel] = g["critics"]
    out["folders"][rel] = g
    for (cell, seed), rec in g["runs"].items():
      b = (horizon_of(cell), seed)
      if owner.setdefault(b, rel) != rel:
        raise ValueError(f"H={b[0]} seed {b[1]} has runs in {owner[b]} and in {rel}: a block is one machine's "
                         "(amendment 1, docs/STUDY_ROUND3.md)")
      out["runs"][(cell, seed)] = {**rec, "_kind": rel}
  return out


def table(exps, cstats: dict, items: list[dict], first: str) -> str:
  """Amendment 1's descriptive check: each claim's mean paired difference A - B, pooled and per machine kind,
  for the claims with a seed from a kind other than `first` ('' when none has)."""
  # Here, not at the top: the runner imports this module, and tables.py brings matplotlib with it.
  from experiments.study import stats
  from experiments.study.tables import _table
  from experiments.study.verdicts import METRICS, kind_name
  names = list(dict.fromkeys(rec.get("_kind", first) for cs in cstats.values() for s in cs.values()
                             for rec in s["recs"].values()))
  if names in ([], [first]):
    return ""
  names = [first] + [k for k in names if k != first]
  rows = []
  for i in items:
    if i["kind"] != "claim":
      continue
    cs = cstats[i["exp"]]
    for metric in METRICS:
      seeds, d = stats.paired(cs[i["a"]][metric], cs[i["b"]][metric])
      kind = {s: cs[i["a"]]["recs"][s].get("_kind", first) for s in seeds}
      if all(kind[s] == first for s in seeds):
        continue
      def said(ks):
        xs = [x for s, x in zip(seeds, d) if kind[s] in ks]
        return f"{sum(xs) / len(xs):+.3f} (n {len(xs)})" if xs else "—"
      rows.append([f"{i['exp']}: {i['a']} > {i['b']}", metric, said(set(names)), *(said({k}) for k in names)])
  if not rows:
    return ""
  return ("Each claim's mean paired difference A - B, over all its seeds and over each machine kind's alone "
          "(descriptive, no test: amendment 1 pools the kinds' seeds in the registered tests above, and this "
          "table shows whether the kinds disagree), for the claims with a seed from a second kind.\n\n"
          + _table(["claim", "metric", "all seeds", *(kind_name(k) for k in names)], rows))
