"""Shared test set-up: 8 fake CPU devices, set before JAX starts."""
import os

# Sharding tests need several devices; on CPU XLA can pretend to have them.
# This must happen before the first `import jax` anywhere in the session.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
