"""Running the real entry point in a subprocess, on one CPU device."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A run small enough for CI: every stage, a 1-layer model, a few updates.
DEFAULT = "configs/default.py:runlocal=true"
TINY = [
    "--config.model.n_layers=1", "--config.model.dim=32", "--config.model.mlp_dim=64",
    "--config.model.head_dim=8",
    "--config.demos.episodes=32", "--config.rollout.context_cap=192",
]


def env_one_device():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # one device: faster, and what a laptop run uses
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONUNBUFFERED"] = "1"
  return env


def main_cmd(workdir, *extra, config=DEFAULT):
  return [sys.executable, "-m", "mtrl_jax.main", f"--config={config}", *TINY, f"--workdir={workdir}", *extra]


def run_main(workdir, *extra, config=DEFAULT, timeout=300):
  return subprocess.run(main_cmd(workdir, *extra, config=config), cwd=ROOT, env=env_one_device(),
                        capture_output=True, text=True, timeout=timeout)
