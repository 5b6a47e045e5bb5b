"""launch/local.sh without running JAX: its dry run and its argument checks.
(The real multi-process runs are in tests/train/test_multihost_main.py.)"""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch", "local.sh")


def _run(*args, **env):
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, **env))


def test_dry_run_gives_each_process_its_rank_and_devices():
  """Catches a launcher that gives every process the same rank or the wrong count."""
  out = _run("3", "--config=configs/default.py", "--workdir=/tmp/x", DRY_RUN="1", PORT="1234", DEVICES="2")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 3
  for rank, line in enumerate(lines):
    assert f"MTRL_PROCESS_ID={rank} " in line and "MTRL_NUM_PROCESSES=3" in line
    assert "MTRL_COORDINATOR_ADDRESS=127.0.0.1:1234" in line
    assert "--xla_force_host_platform_device_count=2" in line
    assert "-m mtrl_jax.main --config=configs/default.py --workdir=/tmp/x" in line
    assert line.endswith(f"/tmp/x/logs/process-{rank}.log")


def test_bad_arguments_fail_with_a_message():
  bad = _run("two", "--workdir=/tmp/x")
  assert bad.returncode == 2 and "NUM_PROCESSES" in bad.stderr
  nowork = _run("2", "--config=configs/default.py")
  assert nowork.returncode == 2 and "--workdir" in nowork.stderr
  assert _run("--help").returncode == 0
