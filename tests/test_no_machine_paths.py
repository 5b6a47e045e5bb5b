"""No committed file names a folder of the machine it was written on.

A path like /work/..., /root/... or /home/alice/... in a doc or a comment points at a development machine:
a reader's machine has none of it (issue 40). Generic places stay fine: /tmp/..., ~/.cache/...,
/home/$USER/... (a placeholder), /mnt/bucket/.... Reads every file git tracks (text only).
Break checked: "/work/shared/STACK.md" put back into docs/accelerator.md fails it, naming the line.
"""
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A development machine's folders: /work/, /root/, a named home folder (not $USER), a macOS user folder.
MACHINE_PATH = re.compile(r"(?<![\w.$/-])(/work/|/root/|/home/(?!\\?\$)[\w.-]+/|/Users/[\w.-]+/)")


def tracked() -> list[str]:
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    pytest.skip(f"not a git checkout here: {e}")
  return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_names_a_development_machines_folder():
  hits = []
  for path in tracked():
    if path == "tests/test_no_machine_paths.py":  # this file spells the patterns out
      continue
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
      continue
    with open(full, "rb") as f:
      data = f.read()
    if b"\0" in data[:8192]:  # binary (figures, weights)
      continue
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
      if MACHINE_PATH.search(line):
        hits.append(f"{path}:{n}: {line.strip()[:120]}")
  assert not hits, "paths of a development machine in committed files:\n" + "\n".join(hits)


@pytest.mark.parametrize("line,bad", [
    ("basis: /work/shared/STACK.md's numbers", True), ("cd /root/mtrl && run", True),
    ("--workdir=/home/alice/runs/x", True), ("open /Users/bob/x.png", True),
    ("--workdir=/tmp/sweep --root /tmp/x", False), ("~/.cache/mtrl_jax/jax", False),
    ("--workdir=/home/$USER/runs/rloo-h6", False), ("--root /home/\\$USER/sweep", False),
    ("--config.workdir=/mnt/bucket/runs", False), ("a/work/b and x/root/y", False),
])
def test_the_pattern(line, bad):
  """The pattern on the lines it must and must not flag (a placeholder home, /tmp, a path's inner
  /work/ are fine)."""
  assert bool(MACHINE_PATH.search(line)) is bad
