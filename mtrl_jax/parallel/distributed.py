"""Joining a multi-host run: `jax.distributed.initialize` from config and environment.

Call `initialize_from_config` first thing in main, before any other JAX call:
JAX fixes its device list on first use. A launcher runs the same command on
every host and tells each its rank through the environment:

  MTRL_COORDINATOR_ADDRESS=10.0.0.1:8476  MTRL_NUM_PROCESSES=4  MTRL_PROCESS_ID=<rank>

A field set in the config wins over the environment. `auto=True` leaves the
discovery to JAX (TPU VM pods, SLURM, ...), which needs no addresses at all.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import NamedTuple

import jax

from mtrl_jax.parallel.config_access import read_field

log = logging.getLogger(__name__)

ENV_COORDINATOR = "MTRL_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "MTRL_NUM_PROCESSES"
ENV_PROCESS_ID = "MTRL_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Where the coordinator is and who this process is; `source` names each field's origin."""
  coordinator_address: str | None = None
  num_processes: int = 1
  process_id: int = 0
  local_device_ids: tuple | None = None
  auto: bool = False
  initialization_timeout: int = 300
  heartbeat_timeout: int = 100  # seconds without a heartbeat before a process counts as dead
  source: tuple = ()  # ((field, "config.distributed.x" or "$ENV"), ...) for error messages

  def origin(self, name: str) -> str:
    return dict(self.source).get(name, f"config.distributed.{name}")


class ProcessInfo(NamedTuple):
  process_id: int
  num_processes: int
  local_devices: int
  global_devices: int


def _int_env(env, name: str):
  raw = env.get(name)
  if raw is None or raw == "":
    return None
  try:
    return int(raw)
  except ValueError:
    raise ValueError(f"${name}={raw!r} is not an integer") from None


def resolve_config(cfg=None, env=None) -> DistributedConfig:
  """Merges a `config.distributed` section (or a whole config holding one) with the environment.

  Checks the result: several processes need a coordinator address, and a
  process id in [0, num_processes).
  """
  env = os.environ if env is None else env
  section = read_field(cfg, "distributed", cfg) if cfg is not None else None
  values, source = {}, {}
  for name, env_name, parse in (("coordinator_address", ENV_COORDINATOR, lambda e, n: e.get(n) or None),
                                ("num_processes", ENV_NUM_PROCESSES, _int_env),
                                ("process_id", ENV_PROCESS_ID, _int_env)):
    value = read_field(section, name)
    if value is not None:
      values[name], source[name] = value, f"config.distributed.{name}"
    elif (value := parse(env, env_name)) is not None:
      values[name], source[name] = value, f"${env_name}"
  for name in ("local_device_ids", "auto", "initialization_timeout", "heartbeat_timeout"):
    value = read_field(section, name)
    if value is not None:
      values[name] = tuple(value) if name == "local_device_ids" else value
  out = DistributedConfig(**values, source=tuple(source.items()))
  if out.auto:
    return out
  if not isinstance(out.num_processes, int) or out.num_processes < 1:
    raise ValueError(f"{out.origin('num_processes')}={out.num_processes!r} must be a positive integer")
  if out.num_processes > 1:
    if not out.coordinator_address:
      raise ValueError(f"{out.num_processes} processes need a coordinator: set "
                       f"config.distributed.coordinator_address or ${ENV_COORDINATOR} (host:port)")
    if not isinstance(out.process_id, int) or not 0 <= out.process_id < out.num_processes:
      raise ValueError(f"{out.origin('process_id')}={out.process_id!r} must be in [0, {out.num_processes})")
  return out


def initialize_from_config(cfg=None, env=None) -> ProcessInfo:
  """Joins the run described by config + environment; a no-op for a single process.

  Safe to call twice (a second call only reports). Returns this process's
  rank and device counts.
  """
  dc = resolve_config(cfg, env)
  if jax.distributed.is_initialized():
    log.info("jax.distributed already initialised; keeping it")
  elif dc.auto:
    jax.distributed.initialize(local_device_ids=dc.local_device_ids,
                               initialization_timeout=dc.initialization_timeout,
                               heartbeat_timeout_seconds=dc.heartbeat_timeout)
  elif dc.num_processes > 1:
    jax.distributed.initialize(coordinator_address=dc.coordinator_address,
                               num_processes=dc.num_processes, process_id=dc.process_id,
                               local_device_ids=dc.local_device_ids,
                               initialization_timeout=dc.initialization_timeout,
                               heartbeat_timeout_seconds=dc.heartbeat_timeout)
  info = ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())
  if info.num_processes > 1 or dc.auto:
    log.info("process %d of %d: %d local of %d global devices", *info)
  return info


def default_distributed_config():
  """The `config.distributed` section; None fields fall back to the MTRL_* environment."""
  import ml_collections
  return ml_collections.ConfigDict(dict(
      coordinator_address=ml_collections.FieldReference(None, field_type=str),
      num_processes=ml_collections.FieldReference(None, field_type=int),
      process_id=ml_collections.FieldReference(None, field_type=int),
      auto=False, initialization_timeout=300, heartbeat_timeout=100))
