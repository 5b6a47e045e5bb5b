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


# XLA's CPU backend at LLVM level 0, as the suite compiles in process (tests/conftest.py): the job
# subprocesses are mostly compiling too. A tiny main job (TINY, 3 RL updates) took 26 CPU seconds
# instead of 44 (2-core CPU, 2026-11-28). Runs compared with each other compile alike.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def env_one_device():
  env = dict(os.environ)
  env["XLA_FLAGS"] = FAST_COMPILE  # one device (not the suite's 8 fake ones): faster, what a laptop run uses
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONUNBUFFERED"] = "1"
  return env


def shared_compile_cache(folder) -> str:
  """The flag that gives the runs of one test one persistent compile cache (config.compile_cache): a
  kill-and-resume test's reference, killed and resumed runs compile the same programs, so the second
  and third load them instead (a tiny main job's second run: 10 CPU seconds instead of 27). Loaded
  programs are the compiled ones, so the runs' numbers are those they would compute uncached."""
  return f"--config.compile_cache={folder}"


def main_cmd(workdir, *extra, config=DEFAULT):
  return [sys.executable, "-m", "mtrl_jax.main", f"--config={config}", *TINY, f"--workdir={workdir}", *extra]


def run_main(workdir, *extra, config=DEFAULT, timeout=300):
  return subprocess.run(main_cmd(workdir, *extra, config=config), cwd=ROOT, env=env_one_device(),
                        capture_output=True, text=True, timeout=timeout)
