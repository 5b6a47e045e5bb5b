"""benchmarks/weights_transfer.py: a file cut into parts with SHA-256 sums and joined back.

Breaks checked (each made by hand, the test seen failing, then undone):
- `plan_parts` with `range(0, total - 1, part_bytes)` (a last part of one byte
  dropped): `test_parts_cover_the_file` fails (hypothesis finds total = part + 1).
- `check_parts` without the per-part hash comparison: the corrupt part is
  reported only by the whole-file sum, without its index, and
  `test_a_corrupt_part_fails_naming_it` fails on the message.
- `join_parts` writing the parts in reverse order:
  `test_split_then_join_gives_the_same_bytes` fails (whole-file sum).
- `call_plan` putting the wheels in the first call: `test_call_plan_...` fails.
- the parts joined by file name (`sorted(m.parts, key=lambda p: p.file)`, in `join_order` or in
  `join_parts`' loop: gguf_part10 before gguf_part2): `test_thirteen_parts_join_in_index_order` fails.
- `materialize` falling back to random weights on a `JoinError` (the `except JoinError: raise`
  removed): `test_a_whole_file_mismatch_says_why_and_random_weights_do_not_hide_it` fails.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("weights_transfer", os.path.join(REPO, "benchmarks",
                                                                                "weights_transfer.py"))
wt = importlib.util.module_from_spec(_spec)
sys.modules["weights_transfer"] = wt
_spec.loader.exec_module(wt)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 10_000), part=st.integers(1, 3_000))
def test_parts_cover_the_file(total, part):
  """Consecutive, non-overlapping, none larger than asked, covering every byte once."""
  plan = wt.plan_parts(total, part)
  assert plan[0][0] == 0
  assert all(o2 == o1 + s1 for (o1, s1), (o2, _) in zip(plan, plan[1:]))
  assert sum(s for _, s in plan) == total
  assert all(0 < s <= part for _, s in plan) or total == 0
  assert len(plan) == max(1, -(-total // part))


def _synthetic(tmp_path, n=10_000 + 17, part=4_000):
  data = os.urandom(n)
  src = tmp_path / "model.gguf"
  src.write_bytes(data)
  out = tmp_path / "dev"
  m = wt.split_file(str(src), str(out), part)
  return data, out, m


def test_split_then_join_gives_the_same_bytes(tmp_path):
  data, out, m = _synthetic(tmp_path)
  assert [p.size for p in m.parts] == [4000, 4000, 2017]
  assert sorted(os.listdir(out)) == ["gguf_part0", "gguf_part1", "gguf_part2"]
  for p in m.parts:  # every part folder carries the same manifest, so any one call's folder names them all
    assert json.loads((out / os.path.dirname(p.file) / "manifest.json").read_text()) == m.to_json()
  joined = tmp_path / "joined.gguf"
  got = wt.join_parts(str(out), str(joined))
  assert joined.read_bytes() == data
  assert got.sha256 == wt.hashlib.sha256(data).hexdigest()


def test_a_corrupt_part_fails_naming_it(tmp_path):
  data, out, m = _synthetic(tmp_path)
  p1 = out / m.parts[1].file
  b = bytearray(p1.read_bytes())
  b[123] ^= 1  # one flipped bit, same size
  p1.write_bytes(bytes(b))
  with pytest.raises(wt.TransferError, match=r"part 1 \(gguf_part1/model\.gguf\.part1\) is corrupt"):
    wt.join_parts(str(out), str(tmp_path / "joined.gguf"))
  assert not (tmp_path / "joined.gguf").exists()
  # the command line says it too, and exits 1
  assert wt.main(["join", "--src", str(out), "--out", str(tmp_path / "j2.gguf")]) == 1


def test_a_missing_or_short_part_fails_naming_it(tmp_path):
  data, out, m = _synthetic(tmp_path)
  shutil.rmtree(out / "gguf_part2")  # the call that carried it never happened
  with pytest.raises(wt.TransferError, match=r"part 2 \(gguf_part2/model\.gguf\.part2\) is missing"):
    wt.join_parts(str(out), str(tmp_path / "j.gguf"))
  p0 = out / m.parts[0].file
  p0.write_bytes(p0.read_bytes()[:-1])
  with pytest.raises(wt.TransferError, match=r"part 0 .* has 3999 bytes, the manifest says 4000"):
    wt.join_parts(str(out), str(tmp_path / "j.gguf"))


def test_no_part_at_all_and_mixed_splits_fail(tmp_path):
  with pytest.raises(wt.TransferError, match="no part of the GGUF arrived"):
    wt.join_parts(str(tmp_path), str(tmp_path / "j.gguf"))
  _, out, _ = _synthetic(tmp_path)
  other = tmp_path / "other"
  (tmp_path / "b.gguf").write_bytes(b"x" * 5000)
  wt.split_file(str(tmp_path / "b.gguf"), str(other), 4000)
  shutil.copytree(other / "gguf_part1", out / "gguf_part1", dirs_exist_ok=True)
  with pytest.raises(wt.TransferError, match="parts of two splits mixed"):
    wt.join_parts(str(out), str(tmp_path / "j.gguf"))


def test_a_second_split_removes_stale_part_folders(tmp_path):
  _, out, _ = _synthetic(tmp_path)  # 3 parts
  m = wt.split_file(str(tmp_path / "model.gguf"), str(out), 6_000)  # now 2
  assert sorted(os.listdir(out)) == ["gguf_part0", "gguf_part1"]
  assert wt.join_parts(str(out), str(tmp_path / "j.gguf")).sha256 == m.sha256


def _rewrite_manifests(out, m):
  for p in m.parts:
    wt._write_manifest(str(out / os.path.dirname(p.file)), m)


def test_thirteen_parts_join_in_index_order(tmp_path):
  """13 parts: by name, gguf_part10..12 sort between gguf_part1 and gguf_part2; the join goes by
  index and gives the file back byte for byte."""
  data, out, m = _synthetic(tmp_path, n=12 * 700 + 5, part=700)
  assert len(m.parts) == 13
  names = sorted(os.listdir(out))
  assert names.index("gguf_part10") < names.index("gguf_part2")  # the trap a join by name falls into
  joined = tmp_path / "joined.gguf"
  wt.join_parts(str(out), str(joined))
  assert joined.read_bytes() == data
  assert [p.index for p in wt.join_order(m)] == list(range(13))


def test_a_whole_file_mismatch_says_why_and_random_weights_do_not_hide_it(tmp_path):
  """Every part intact but the manifest's whole-file sum wrong: the join fails naming the order it
  joined in, the expected and the actual size and sum, and says it is no lost part; `materialize`
  fails with it too (a header is there, so a fallback to random weights would have been possible)."""
  data, out, m = _synthetic(tmp_path, n=11 * 300 + 1, part=300)
  assert len(m.parts) == 12
  bad = m._replace(sha256="0" * 64)
  _rewrite_manifests(out, bad)
  real = wt.hashlib.sha256(data).hexdigest()
  with pytest.raises(wt.JoinError) as e:
    wt.join_parts(str(out), str(tmp_path / "j.gguf"))
  msg = str(e.value)
  assert "joined in the order 0 (gguf_part0/model.gguf.part0, bytes 0-299), 1 (" in msg
  assert "10 (gguf_part10/model.gguf.part10, bytes 3000-3299), 11 (gguf_part11/model.gguf.part11, bytes 3300-3300)" in msg
  assert f"make {len(data)} bytes with sha256 {real}" in msg
  assert f"expects {len(data)} bytes with sha256 {'0' * 64}" in msg and "not a lost part" in msg
  assert not (tmp_path / "j.gguf").exists() and not (tmp_path / "j.gguf.joining").exists()
  try:
    wt.import_gguf()
  except ImportError as err:
    pytest.skip(str(err))
  (out / wt.HEADER_DIR).mkdir()
  (out / wt.HEADER_DIR / "model.header.gguf").write_bytes(b"GGUF")
  with pytest.raises(wt.JoinError, match="not a lost part"):
    wt.materialize(str(out), str(tmp_path / "hf"), 1, str(tmp_path))


def test_offsets_that_do_not_follow_the_indices_are_named(tmp_path):
  """A manifest whose parts 2 and 3 swapped offsets (each part's own sum still matches): the join
  refuses before writing, naming part 2 and where it should start."""
  _, out, m = _synthetic(tmp_path, n=5 * 400, part=400)
  parts = list(m.parts)
  parts[2], parts[3] = parts[2]._replace(offset=parts[3].offset), parts[3]._replace(offset=parts[2].offset)
  _rewrite_manifests(out, m._replace(parts=parts))
  with pytest.raises(wt.JoinError, match=r"part 2 \(gguf_part2/model\.gguf\.part2\) starts at byte 1200, "
                                         r"but the parts before it end at byte 800"):
    wt.join_parts(str(out), str(tmp_path / "j.gguf"))


def test_call_plan_sends_each_part_once_and_the_wheels_with_the_last(tmp_path, monkeypatch):
  """The last call carries the last part, the wheels and the header (it runs device_check.sh);
  the MiB counted are the working tree's plus the carried folders'."""
  monkeypatch.setattr(wt, "REPO", str(tmp_path))
  monkeypatch.setattr(wt, "tree_mib", lambda repo=None: 4.0)
  data, out, m = _synthetic(tmp_path, n=3 * wt.MIB, part=2 * wt.MIB)
  (out / "wheels").mkdir()
  (out / "wheels" / "a.whl").write_bytes(b"w" * (wt.MIB // 2))
  calls = wt.call_plan(str(out), m)
  assert [c["carry"] for c in calls] == [["dev/gguf_part0"], ["dev/gguf_part1", "dev/wheels", "dev/gguf_header"]]
  manifest_mib = os.path.getsize(out / "gguf_part0" / "manifest.json") / wt.MIB
  assert calls[0]["mib"] == pytest.approx(4.0 + 2.0 + manifest_mib, abs=0.01)
  assert calls[1]["mib"] == pytest.approx(4.0 + 1.0 + manifest_mib + 0.5, abs=0.01)
  assert all(c["fits"] for c in calls)


def test_smollm2_header_is_a_gguf_without_tensors(tmp_path):
  """The header file keeps the real model's metadata (shape, tokenizer) and drops every tensor."""
  gguf_convert = pytest.importorskip("mtrl_jax.models.gguf_convert")
  try:
    path = gguf_convert.find_gguf("smollm2")
    wt.import_gguf()
  except (FileNotFoundError, ImportError) as e:
    pytest.skip(str(e))
  head = wt.write_header(path, str(tmp_path))
  assert os.path.getsize(head) < 2 * wt.MIB
  f = gguf_convert.GGUFFile(head)
  assert f.tensors == {}
  cfg = gguf_convert.hf_config(f)
  assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
  assert len(f.strings("tokenizer.ggml.tokens")) == 49152


@pytest.mark.slow
def test_materialize_falls_back_to_random_weights_of_the_real_shape(tmp_path):
  """A corrupt part: the folder gets random weights with the real folder's tensor names and shapes,
  config and tokenizer, and says why (naming the part).

  Break checked: `random_folder` building the model from `hf_config(f)` without `layers`
  (all 30 blocks) fails the tensor-name comparison.
  """
  pytest.importorskip("tokenizers", reason="tokenizer.json needs tokenizers (.[hf])")
  from safetensors.numpy import load_file

  from mtrl_jax.models import gguf_convert
  try:
    path = gguf_convert.find_gguf("smollm2")
    wt.import_gguf()
  except (FileNotFoundError, ImportError) as e:
    pytest.skip(str(e))
  src = tmp_path / "dev"
  m = wt.split_file(path, str(src), 56 * wt.MIB)
  wt.write_header(path, str(src))
  with open(src / m.parts[1].file, "r+b") as f:
    f.seek(1000)
    f.write(b"\xff")
  rec = wt.materialize(str(src), str(tmp_path / "rand"), 1, str(tmp_path))
  assert rec["weights"] == "random" and "part 1 (gguf_part1/" in rec["reason"] and "corrupt" in rec["reason"]
  gguf_convert.convert(path, str(tmp_path / "real"), layers=1, log=lambda _: None)
  real, rand = load_file(str(tmp_path / "real" / "model.safetensors")), load_file(
      str(tmp_path / "rand" / "model.safetensors"))
  assert {k: v.shape for k, v in rand.items()} == {k: v.shape for k, v in real.items()}
  assert not np.allclose(rand["model.embed_tokens.weight"], real["model.embed_tokens.weight"])
  for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
    assert (tmp_path / "rand" / name).read_bytes() == (tmp_path / "real" / name).read_bytes(), name
  assert json.loads((tmp_path / "rand" / "config.json").read_text()) == json.loads(
      (tmp_path / "real" / "config.json").read_text())
  assert rec["params"] == sum(v.size for v in real.values())
