"""Reading a config section that may be a ConfigDict, a dict or a dataclass."""
from __future__ import annotations

from typing import Any


def read_field(section: Any, key: str, default: Any = None) -> Any:
  """`section[key]` for mappings / ConfigDicts, `section.key` otherwise; default when absent or None."""
  if section is None:
    return default
  if hasattr(section, "get") and callable(section.get):
    value = section.get(key, default)
  else:
    value = getattr(section, key, default)
  return default if value is None else value
