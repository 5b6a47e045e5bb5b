"""Demonstrations round-trip through TFDS array_record files without TensorFlow."""
import json
import os
import subprocess
import sys

import pytest

from mtrl_jax import envs
from mtrl_jax.data import demos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _expected(env_name, env_kwargs, episodes, quality, seed=0):
  env = envs.make(env_name, **env_kwargs)
  return [demos.record_episode(env, seed + i, quality, env_name, env_kwargs)
          for i in range(episodes)]


def _same(session, example):
  assert session["env"] == example["env"]
  assert session["env_kwargs"] == json.loads(example["env_kwargs"])
  assert session["seed"] == example["seed"] and session["prompt"] == example["prompt"]
  assert session["final_observation"] == example["final_observation"]
  assert session["success"] == example["success"]
  assert session["truncated"] == example["truncated"]
  assert session["num_turns"] == len(session["turns"]) == len(example["turns"])
  assert session["return"] == pytest.approx(example["return"], abs=1e-6)
  for got, want in zip(session["turns"], example["turns"]):
    assert (got["observation"], got["action"], got["invalid"]) == (
        want["observation"], want["action"], want["invalid"])
    assert got["reward"] == pytest.approx(want["reward"], abs=1e-6)


def test_round_trip_equal_content(tmp_path):
  kwargs = {"length": 2}
  path = demos.build_demos("memory", kwargs, episodes=12, data_dir=str(tmp_path), quality=0.6,
                           seed=5)
  assert os.path.isfile(os.path.join(path, "dataset_info.json"))
  assert any(f.endswith(".array_record-00000-of-00001") or ".array_record" in f
             for f in os.listdir(path))
  sessions = demos.load_demos(str(tmp_path), "memory", kwargs, quality=0.6, seed=5)
  expected = _expected("memory", kwargs, 12, 0.6, seed=5)
  assert len(sessions) == 12
  for session, example in zip(sessions, expected):
    _same(session, example)
  assert [s["seed"] for s in sessions] == list(range(5, 17))  # episode order kept
  # Quality 0.6 mixes in random actions: some sessions fail, most succeed.
  assert 0 < sum(s["success"] for s in sessions) < 12
  # The same data through tfds.data_source, by dataset name and config.
  import tensorflow_datasets as tfds
  config = os.path.basename(os.path.dirname(path))
  source = tfds.data_source(f"{demos.DATASET}/{config}", data_dir=str(tmp_path), split="train")
  assert len(source) == 12 and source[0]["prompt"].decode() == sessions[0]["prompt"]


def test_several_envs_and_qualities_share_a_data_dir(tmp_path):
  d = str(tmp_path)
  p1 = demos.build_demos("memory", {}, episodes=4, data_dir=d, quality=1.0)
  p2 = demos.build_demos("memory", {}, episodes=4, data_dir=d, quality=0.5)
  p3 = demos.build_demos("repair", {"bugs": 2}, episodes=3, data_dir=d)
  p4 = demos.build_demos("memory", {"length": 5}, episodes=4, data_dir=d)
  assert len({p1, p2, p3, p4}) == 4 and len(demos.list_demos(d)) == 4
  assert demos.build_demos("memory", {}, episodes=4, data_dir=d) == p1  # built once
  assert all(s["success"] for s in demos.load_demos(d, "memory"))
  repair = demos.load_demos(d, "repair", {"bugs": 2})
  assert len(repair) == 3 and all(s["turns"][-1]["action"] == "submit" for s in repair)
  assert demos.load_demos(p4)[0]["env_kwargs"] == {"length": 5}  # a dataset dir works too
  with pytest.raises(FileNotFoundError, match="no demos for keydoor"):
    demos.load_demos(d, "keydoor")
  with pytest.raises(ValueError, match="name the env"):
    demos.load_demos(d)
  with pytest.raises(ValueError, match="'lenght'"):
    demos.build_demos("memory", {"lenght": 3}, episodes=2, data_dir=d)


def test_env_errors_drop_only_their_episodes(tmp_path):
  sessions = demos.load_demos(demos.build_demos(
      "faulty", {"env": "memory", "rate": 0.2}, episodes=20, data_dir=str(tmp_path)))
  assert 0 < len(sessions) < 20 and all(s["success"] for s in sessions)


def test_cli_builds_and_summarizes(tmp_path):
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run(
      [sys.executable, "-m", "mtrl_jax.data.demos", "--env", "keydoor", "--episodes", "5",
       "--data_dir", str(tmp_path), "--quality", "0.9", "--env_kwargs", '{"size": 4}'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary["sessions"] == 5 and "keydoor-q090-s0-n5-" in summary["path"]
  assert len(demos.load_demos(str(tmp_path), "keydoor", {"size": 4}, quality=0.9)) == 5
