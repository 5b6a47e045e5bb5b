"""The play CLI: a readable summary whose last line is one JSON object."""
import json
import os
import subprocess
import sys

import pytest

from mtrl_jax.envs import play

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = {"success_rate", "mean_return", "mean_turns", "env_errors"}


def run_cli(*args: str) -> tuple[str, dict]:
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-m", "mtrl_jax.envs.play", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["keydoor", "memory", "repair"])
def test_cli_expert_and_random_on_builtins(name):
  out, expert = run_cli("--env", name, "--policy", "expert", "--episodes", "50")
  assert KEYS <= set(expert) and f"{name} {{}} | policy expert" in out
  assert expert["success_rate"] >= 0.95 and expert["env_errors"] == 0
  _, rand = run_cli("--env", name, "--policy", "random", "--episodes", "50", "--seed", "7")
  assert rand["success_rate"] < expert["success_rate"] - 0.5


def test_cli_textarena_frozenlake():
  pytest.importorskip("textarena")
  out, s = run_cli("--env", "textarena", "--env_kwargs", '{"game": "FrozenLake-v0"}',
                   "--policy", "expert", "--episodes", "10", "--show", "1")
  assert s["success_rate"] == 1.0 and s["env_kwargs"] == {"game": "FrozenLake-v0"}
  assert ">>> [" in out and "won" in out  # the transcript of episode 0


def test_env_errors_end_only_their_episode():
  s = play.play("faulty", {"env": "memory", "rate": 0.2}, "expert", episodes=200)
  # An episode survives its 5 steps with probability 0.8 ** 5 = 0.33.
  assert 110 < s["env_errors"] < 155 and s["success_rate"] == 1.0


def test_quality_knob_degrades_the_expert():
  good = play.play("keydoor", {}, "expert", episodes=100, quality=1.0)
  bad = play.play("keydoor", {}, "expert", episodes=100, quality=0.3)
  assert bad["success_rate"] < good["success_rate"] and bad["mean_turns"] > good["mean_turns"]
