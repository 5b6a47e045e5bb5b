"""Fixtures shared by the study runner's tests (test_starts.py, test_kinds.py)."""
import pytest

from experiments.study import runner
from mtrl_jax.compile import cache as compile_cache


@pytest.fixture
def launched(monkeypatch):
  """runner.main with its job pool replaced: the names each pool call was given (warm, critic, run)."""
  monkeypatch.setenv(compile_cache.ENV, "")
  got: dict = {}

  def pool(jobs, parallel, what, on_done=None, in_process=False):
    got.setdefault(what, []).extend(n for n, _, _ in jobs)
    return []
  monkeypatch.setattr(runner, "_pool", pool)
  return got
