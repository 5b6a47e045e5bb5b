"""Config + environment -> jax.distributed arguments; single process is a no-op."""
import jax
import pytest

from mtrl_jax.parallel import initialize_from_config
from mtrl_jax.parallel.distributed import default_distributed_config, resolve_config


def test_environment_fills_what_config_leaves_unset():
  env = {"MTRL_COORDINATOR_ADDRESS": "10.0.0.1:1234", "MTRL_NUM_PROCESSES": "4", "MTRL_PROCESS_ID": "3"}
  dc = resolve_config(default_distributed_config(), env)
  assert (dc.coordinator_address, dc.num_processes, dc.process_id) == ("10.0.0.1:1234", 4, 3)
  assert dc.origin("process_id") == "$MTRL_PROCESS_ID"


def test_config_wins_over_environment():
  cfg = default_distributed_config()
  cfg.process_id = 1
  dc = resolve_config({"distributed": cfg}, {"MTRL_COORDINATOR_ADDRESS": "h:1", "MTRL_NUM_PROCESSES": "2",
                                             "MTRL_PROCESS_ID": "0"})
  assert dc.process_id == 1 and dc.origin("process_id") == "config.distributed.process_id"


@pytest.mark.parametrize("cfg,env,needle", [
    ({"num_processes": 2, "process_id": 0}, {}, "need a coordinator"),
    ({"coordinator_address": "h:1", "num_processes": 2}, {"MTRL_PROCESS_ID": "2"}, r"\$MTRL_PROCESS_ID=2 must be in \[0, 2\)"),
    ({"num_processes": 0}, {}, "config.distributed.num_processes=0"),
    ({}, {"MTRL_NUM_PROCESSES": "two"}, r"\$MTRL_NUM_PROCESSES='two' is not an integer"),
])
def test_bad_settings_name_their_source(cfg, env, needle):
  with pytest.raises(ValueError, match=needle):
    resolve_config(cfg, env)


def test_single_process_is_a_noop(monkeypatch):
  for name in ("MTRL_COORDINATOR_ADDRESS", "MTRL_NUM_PROCESSES", "MTRL_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  info = initialize_from_config(None)
  assert tuple(info) == (0, 1, jax.local_device_count(), jax.device_count())
  assert not jax.distributed.is_initialized()
