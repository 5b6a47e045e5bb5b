"""Markers of the sharding tests (moving to setup.cfg / pyproject later)."""


def pytest_configure(config):
  config.addinivalue_line("markers", "multiprocess: launches several local JAX processes")
  config.addinivalue_line("markers", "slow: takes tens of seconds on a 2-core CPU")
