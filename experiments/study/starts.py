"""Whether the starts a study root's runs begin from are the starts the records say they are.

Every run of a round at one horizon starts from that horizon's policy warm start, and a critic arm from one
of its critic warm starts; the only trace of those starts in the repo is their records (docs/study3/warm/,
critics/). A run pairs with the recorded runs of its seed only if it starts where they started. A start
rebuilt from the same code on another machine can be another start: XLA's CPU code follows the processor, so
its summation order does. Measured (2026-12-01): round 3's H=2 and H=8 starts rebuilt at 4f1b16a on an Intel
Xeon (2 cores) matched the AMD EPYC records' evals to the last task, yet every critic differed, e.g. the H=2
partial critic stopped after 14 rounds at 0.436 of the oracle's EV where the record says 16 rounds and 0.371
(docs/STUDY_ROUND3.md, "Another machine"). A rebuild on the records' own machine read the same to the last
digit (the H=2 full critic, 2026-11-29).

So the runner compares every start of the runs it is about to launch (built now, or found done in its root)
with the record already in the records folder, on the numbers the start's job produced (`WARM_FIELDS`,
`CRITIC_FIELDS`), exactly: a float read back from JSON is the float written. A start with no record yet is
new, and gets one. A start that differs keeps the recorded one (the record is what the recorded runs started
from); the rebuilt one is written to ROOT/start_mismatch/ for a look, and no run that starts from it, or from
the policy warm start under it, is launched (`refused`).
"""
from __future__ import annotations

import json
import os

from experiments.study import records
from experiments.study.plan import critic_warm, policy_warm

# What a start's job produced, as its record keeps it (not the code, machine or wall time: they say how).
# A field a record lacks (written before it existed, e.g. sft_loss) is not compared.
WARM_FIELDS = ("sft_steps", "success", "greedy_success", "decision_cued", "decision_uncued", "greedy_decision_cued",
               "greedy_decision_uncued", "sft_loss")
CRITIC_FIELDS = ("readout", "stopped", "rounds", "readouts")
MISMATCH_DIR = "start_mismatch"


def differences(old: dict, new: dict) -> list[str]:
  """'field: recorded X, rebuilt Y' for each produced number where the rebuilt start's record `new` differs
  from the recorded `old` (the readout compared key by key); [] when they agree on every field `old` has."""
  out = []
  for field in (WARM_FIELDS if old["kind"] == "warm" else CRITIC_FIELDS):
    a = old.get(field)
    if a is None:
      continue
    b = new.get(field)
    pairs = ({f"{field}.{k}": (v, (b or {}).get(k)) for k, v in a.items() if v is not None} if isinstance(a, dict)
             else {field: (a, b)})
    out += [f"{k}: recorded {x!r}, rebuilt {y!r}" for k, (x, y) in sorted(pairs.items()) if x != y]
  return out


def rebuilt_record(root: str, name: str) -> dict | None:
  """The record of start `name` as built in ROOT/warm/<name> (None: not finished there)."""
  workdir = os.path.join(root, "warm", name)
  return records.critic_record(workdir, name) if ",critic,seed=" in name else records.warm_record(workdir, name)


def recorded(out: str, name: str) -> dict | None:
  """The record of start `name` in the records folder `out`, or None."""
  warm, _, seed = name.rpartition(",critic,seed=")
  path = records.path_of(out, {"kind": "critic", "warm": warm, "seed": seed} if warm else
                         {"kind": "warm", "warm": name})
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


def check(out: str, root: str, names) -> dict[str, list[str]]:
  """Start name -> its differences from its record, for each start of `names` that has a record in `out`
  and differs; the rebuilt record of each such start is written under ROOT/start_mismatch/."""
  bad = {}
  for name in names:
    old = recorded(out, name)
    if old is None:
      continue
    new = rebuilt_record(root, name)
    if new is None:
      bad[name] = ["not built in the root: nothing to compare its record with"]
      continue
    if diff := differences(old, new):
      bad[name] = diff
      records.write(os.path.join(root, MISMATCH_DIR), new)
  return bad


def refused(runs: dict, bad) -> list[str]:
  """The runs (name -> Cell) that start from a start in `bad`, directly or through its policy warm start: a
  critic that differs means the policy under it differs too (value pretraining is a function of it), so every
  run of that policy warm start is refused, critic arms or not."""
  policies = {policy_warm(n) if ",critic,seed=" in n else n for n in bad}
  out = []
  for name, cell in runs.items():
    seed = int(name.rsplit("seed=", 1)[1])
    if cell.warm in policies or critic_warm(cell, seed) in bad:
      out.append(name)
  return sorted(out)


def message(bad: dict, n_refused: int, root: str) -> str:
  """What the runner prints when starts differ: each start and its first differences, then what to do."""
  lines = [f"study: {len(bad)} start(s) rebuilt here differ from their records; {n_refused} runs that start from "
           f"them are not launched (they would not pair with the recorded seeds). Machine here: "
           f"{json.dumps(records.machine())}."]
  for name, diff in sorted(bad.items()):
    lines.append(f"  {name}: " + "; ".join(diff[:3]) + (f" (+{len(diff) - 3} more)" if len(diff) > 3 else ""))
  lines.append(f"  The rebuilt records are in {os.path.join(root, MISMATCH_DIR)}. Run these on a machine that "
               "rebuilds the recorded starts (the records' `machine`; records from before it: the 2-core AMD EPYC "
               "of 2026-11-28/29), or with --records '' (no records, no check) for a look of your own.")
  return "\n".join(lines)
