"""Parsing the `:k=v,k=v` argument of `configs/<family>.py:ARGS`."""
from __future__ import annotations


def parse_args(arg: str | None, defaults: dict) -> dict:
  """Typed `k=v` pairs over `defaults`; an unknown key names itself and the known ones."""
  out = dict(defaults)
  if not arg:
    return out
  for part in arg.split(","):
    if not part:
      continue
    if "=" not in part:
      raise ValueError(f"config argument {part!r} is not k=v; known keys: {sorted(defaults)}")
    k, v = part.split("=", 1)
    if k not in defaults:
      raise ValueError(f"unknown config argument {k!r}; known: {sorted(defaults)}")
    d = defaults[k]
    if isinstance(d, bool):
      if v.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"config argument {k}={v!r} is not a bool")
      out[k] = v.lower() in ("true", "1")
    elif isinstance(d, int):
      out[k] = int(v)
    elif isinstance(d, float):
      out[k] = float(v)
    else:
      out[k] = v
  return out
