"""Shape buckets: every request fits its bucket, and few buckets exist."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtrl_jax.sampling.buckets import chunk_bucket, slots_bucket, steps_bucket


@given(need=st.integers(1, 4096), capacity=st.integers(1, 4096))
def test_slots_fit_the_need_and_the_capacity(need, capacity):
  need = min(need, capacity)
  w = slots_bucket(need, capacity)
  assert need <= w <= capacity
  # At most half again the need (or the 64-slot floor).
  assert w <= max(64, need * 3 // 2 + 1)


def test_slots_ladder_is_short():
  capacity = 4096
  sizes = {slots_bucket(n, capacity) for n in range(1, capacity + 1)}
  assert len(sizes) <= 2 * 6 + 1  # ~2 sizes per octave from 64 to 4096
  assert max(sizes) == capacity


def test_chunk_and_steps_buckets():
  assert [chunk_bucket(n, (16, 64)) for n in (1, 16, 17, 64)] == [16, 16, 64, 64]
  with pytest.raises(ValueError, match="length_buckets"):
    chunk_bucket(65, (16, 64))
  assert [steps_bucket(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, 128]
