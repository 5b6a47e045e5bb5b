"""Readable names for pytree paths in error messages: `layers/0/attn/wq`, `tokens_bt`."""
from __future__ import annotations


def path_str(path) -> str:
  """Joins dict keys, attribute names and indices with '/', skipping Variable's `value` level."""
  parts = []
  for k in path:
    name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
    if name != "value":
      parts.append(str(name))
  return "/".join(parts)
