"""Two local processes (4 fake CPU devices each) train as one 8-device mesh."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multihost_worker as worker

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(n: int):
  port = _free_port()
  procs = []
  for rank in range(n):
    # LLVM level 0: as this process compiles the reference (tests/conftest.py)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               MTRL_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", MTRL_NUM_PROCESSES=str(n),
               MTRL_PROCESS_ID=str(rank))
    procs.append(subprocess.Popen([sys.executable, worker.__file__], env=env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


def _collect(procs):
  results = []
  try:
    for rank, p in enumerate(procs):
      out, err = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, f"process {rank} exited {p.returncode}:\n{err[-4000:]}"
      lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
      assert lines, f"process {rank} printed no RESULT:\n{out[-2000:]}\n{err[-4000:]}"
      results.append(json.loads(lines[-1][len("RESULT "):]))
  except subprocess.TimeoutExpired:
    pytest.fail(f"multi-process run did not finish within {TIMEOUT_S}s")
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return results


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_like_one():
  procs = _launch(2)  # started first so the reference below overlaps with them
  from mtrl_jax.parallel import make_mesh
  ref_losses, ref_rows, _ = worker.train_losses(make_mesh(worker.MESH_SHAPE))
  results = _collect(procs)

  assert ref_rows == slice(0, worker.GLOBAL_BATCH)
  half = worker.GLOBAL_BATCH // 2
  for rank, r in enumerate(results):
    assert (r["process_id"], r["num_processes"]) == (rank, 2)
    assert (r["local_devices"], r["global_devices"]) == (4, 8)
    assert r["data_hosts"] == [[0], [1]]  # each data slice lives on one host
    assert r["rows"] == [rank * half, (rank + 1) * half]
    # The weights reached this host's sampling mesh: only its own devices, the
    # global values exactly (a stale or wrong-host copy would differ after training).
    sm = r["sampler"]
    assert sm["fully_addressable"] and sm["sampler_devices"] == sm["local_devices"]
    assert len(sm["local_devices"]) == 4 and sm["sampler_max_diff"] == 0.0
    # LoRA: base + adapters cross hosts once, then the adapters only; applied or merged on
    # the local mesh, the weights equal the global ones.
    ls = r["lora_sampler"]
    assert ls["sent_first"] == ls["adapter_bytes"] + ls["base_bytes"] > 4 * ls["adapter_bytes"]
    assert ls["sent_second"] == ls["adapter_bytes"]
    assert ls["apply_max_diff"] == 0.0 and ls["merge_max_diff"] < 1e-6
    assert ls["merged_leaves"] == ls["base_leaves"] and ls["fully_addressable"]
    assert len(ls["fingerprint"]) == ls["base_leaves"]
  # The base fingerprint of a LoRA checkpoint record (train/adapters.py) is the same on every host.
  assert results[0]["lora_sampler"]["fingerprint"] == results[1]["lora_sampler"]["fingerprint"]
  assert set(results[0]["sampler"]["local_devices"]).isdisjoint(results[1]["sampler"]["local_devices"])
  np.testing.assert_array_equal(results[0]["losses"], results[1]["losses"])
  np.testing.assert_allclose(results[0]["losses"], ref_losses, rtol=1e-5, atol=1e-6)
  assert ref_losses[-1] < ref_losses[0]  # the steps really updated the shared parameters
