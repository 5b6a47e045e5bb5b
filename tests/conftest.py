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

# Hypothesis: no per-example deadline and no "too slow" health check. The
# first example of a property test often pays for a JAX compile, and on a
# loaded 2-core machine generation itself slows down: both would fail a test
# for the machine's load, not for the code (issue 26). Profiles loaded later
# (tests/credit/conftest.py under mutmut) replace this one.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("mtrl", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("mtrl")
