"""The quick tier's wall and CPU time, and where it goes: per folder and per test file.

    python benchmarks/quick_tier.py [--out FILE.json] [--compare OLD.json]
    python benchmarks/quick_tier.py --log PYTEST_OUTPUT.txt [--out ...] [--compare ...]

Runs the README's quick-tier command with `--durations=0` from the repository root (or reads
the output of such a run, --log), then prints a table of the slowest folders and files, the
per-folder change against an earlier profile (--compare), and one JSON line last.

Why it exists: on 2026-12-02 the quick tier took 12 min on a 2-core AMD EPYC where it had
taken 6 min 38 s three days before, and nothing said where the time had moved, because no
per-test profile of the earlier run was kept. `--out` writes one (test seconds summed per
file, plus the machine and the state of the two caches a first run fills), small enough to
commit under benchmarks/quick_tier/, so a later run can be compared file by file.

The two caches: the tests' JAX compilation cache (.pytest_cache/jax_compilation, empty in a
fresh clone) and the TextWorld game pools (~/.cache/mtrl_jax/textworld, empty on a fresh
machine: the tests build 11 games there the first time). Both make a first run slower than
the next, so the profile records whether each was there when the run began.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = [sys.executable, "-m", "pytest", "tests", "-n", "2", "-q", "-m", "not slow and not multiprocess",
           "--durations=0"]
# pytest's --durations lines: "12.34s call     tests/x/test_y.py::test_z[param]"
_DURATION = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+?)::")
_SUMMARY = re.compile(r"^=*\s*(.*\b(passed|failed)\b.*?)\s*=*$")


def parse(text: str) -> dict:
  """Test seconds per file (setup + call + teardown) and pytest's summary line, from its output."""
  per_file: dict = collections.defaultdict(float)
  summary = ""
  for line in text.splitlines():
    if m := _DURATION.match(line):
      per_file[m.group(3)] += float(m.group(1))
    elif m := _SUMMARY.match(line):
      summary = m.group(1)
  if not per_file:
    raise ValueError("no --durations lines in the pytest output: was it run with --durations=0?")
  counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary)}
  return {"files": dict(sorted(per_file.items())), "summary": summary, "counts": counts}


def folder_of(path: str) -> str:
  """tests/train/test_x.py -> tests/train; a top-level test file is its own row."""
  parts = path.split("/")
  return "/".join(parts[:2]) if len(parts) > 2 else path


def by_folder(files: dict) -> dict:
  out: dict = collections.defaultdict(float)
  for f, s in files.items():
    out[folder_of(f)] += s
  return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def cpu_kind() -> str:
  """'AuthenticAMD 25/17, 2 cores' from the first processor of /proc/cpuinfo (else the platform)."""
  import platform
  fields: dict = {}
  if os.path.exists("/proc/cpuinfo"):
    for ln in open("/proc/cpuinfo").read().split("\n\n")[0].splitlines():
      key, _, value = ln.partition(":")
      fields[key.strip()] = value.strip()
  kind = f"{fields.get('vendor_id')} {fields.get('cpu family')}/{fields.get('model')}" if fields else platform.machine()
  return f"{kind}, {os.cpu_count()} cores"


def caches() -> dict:
  tw = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mtrl_jax", "textworld")
  jc = os.path.join(REPO, ".pytest_cache", "jax_compilation")
  return {"jax_compilation_cache": bool(os.path.isdir(jc) and os.listdir(jc)),
          "textworld_pools": bool(os.path.isdir(tw) and os.listdir(tw))}


def run() -> tuple[str, dict]:
  before = caches()
  t0 = time.time()
  p = subprocess.run(COMMAND, cwd=REPO, capture_output=True, text=True)
  wall = time.time() - t0
  ru = resource.getrusage(resource.RUSAGE_CHILDREN)
  print(p.stdout[-3000:] if p.returncode else "", end="")
  return p.stdout, {"wall_s": round(wall, 1), "user_s": round(ru.ru_utime, 1), "sys_s": round(ru.ru_stime, 1),
                    "returncode": p.returncode, "caches_at_start": before}


def commit() -> str | None:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def table(profile: dict, old: dict | None, top: int) -> str:
  folders = by_folder(profile["files"])
  old_folders = by_folder(old["files"]) if old else {}
  lines = [f"{'seconds':>8} {'was':>8} {'change':>8}  folder" if old else f"{'seconds':>8}  folder"]
  for f, s in folders.items():
    if old:
      was = old_folders.get(f, 0.0)
      lines.append(f"{s:8.1f} {was:8.1f} {s - was:+8.1f}  {f}")
    else:
      lines.append(f"{s:8.1f}  {f}")
  lines.append("")
  lines.append(f"{'seconds':>8}  file (the {top} slowest)")
  for f, s in sorted(profile["files"].items(), key=lambda kv: -kv[1])[:top]:
    lines.append(f"{s:8.1f}  {f}")
  return "\n".join(lines)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--log", help="a pytest output (run with --durations=0) to read instead of running the tier")
  ap.add_argument("--out", help="write the profile (per-file seconds, machine, caches) to this JSON file")
  ap.add_argument("--compare", help="an earlier profile (--out) to print the per-folder change against")
  ap.add_argument("--top", type=int, default=15, help="how many of the slowest files to list")
  ap.add_argument("--commit", help="with --log: the commit the log's run tested (default: this checkout's HEAD)")
  ap.add_argument("--machine", help="with --log: the machine it ran on (default: this one's CPU)")
  args = ap.parse_args(argv)
  if args.log:
    text, timing = open(args.log).read(), {}
  else:
    print("running: " + " ".join(COMMAND[2:]) + "  (the README's quick tier, about 10 minutes)", flush=True)
    text, timing = run()
  profile = {**parse(text), **timing, "machine": args.machine or cpu_kind(),
             "commit": args.commit or commit(), "source": os.path.basename(args.log) if args.log else "run"}
  old = json.load(open(args.compare)) if args.compare else None
  print(table(profile, old, args.top))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(profile, f, indent=1, sort_keys=True)
      f.write("\n")
  total = sum(profile["files"].values())
  line = {"test_s": round(total, 1), "files": len(profile["files"]), **profile["counts"],
          **{k: timing[k] for k in ("wall_s", "user_s", "sys_s") if k in timing}, "machine": profile["machine"]}
  if old:
    line["test_s_was"] = round(sum(old["files"].values()), 1)
  print(json.dumps(line))
  return profile


if __name__ == "__main__":
  main()
