"""Registry errors, and the latency / faulty wrappers."""
import os
import random
import statistics
import subprocess
import sys
import time

import pytest

from mtrl_jax import envs
from mtrl_jax.envs import EnvError, registry, wrappers
from env_test_utils import continue_with, run_episode


def test_names_lists_the_suite():
  assert {"keydoor", "memory", "repair", "textarena", "latency", "faulty"} <= set(envs.names())


def test_unknown_env_names_itself_and_the_valid_ones():
  with pytest.raises(ValueError, match=r"unknown env 'memroy'.*keydoor.*memory.*repair"):
    envs.make("memroy")


def test_bad_keyword_names_the_field_and_the_env():
  with pytest.raises(ValueError, match=r"env 'memory'.*'lenght' \(did you mean 'length'\?\)"):
    envs.make("memory", lenght=3)
  with pytest.raises(ValueError, match=r"env 'latency'.*'median'"):
    envs.make("latency", env="memory", median=0.1)
  # The wrapped env's own arguments are checked too.
  with pytest.raises(ValueError, match=r"env 'keydoor'.*'sise'"):
    envs.make("faulty", env="keydoor", env_kwargs={"sise": 3})


def test_bad_values_are_errors():
  with pytest.raises(ValueError, match="num_codes"):
    envs.make("memory", num_codes=1)
  with pytest.raises(ValueError, match="bugs"):
    envs.make("repair", bugs=9, length=4)
  with pytest.raises(ValueError, match="rate"):
    envs.make("faulty", env="memory", rate=1.5)


def test_register_refuses_a_taken_name():
  with pytest.raises(ValueError, match="already registered"):
    registry.register("memory")(type("Other", (), {}))


def test_wrappers_from_config_list():
  env = envs.make("memory", length=1,
                  wrappers=[{"name": "faulty", "rate": 0.0}, {"name": "latency", "median_s": 0.0}])
  assert isinstance(env, wrappers.Latency) and isinstance(env.env, wrappers.Faulty)
  assert env.max_turns == 3 and env.env.env.length == 1
  _, success = run_episode(env, 0)
  assert success and env.turn == 3 and env.code == env.env.env.code  # attributes pass through
  with pytest.raises(ValueError, match="bad wrapper spec"):
    envs.make("memory", wrappers=[{"median_s": 0.1}])


# -- faulty -------------------------------------------------------------------


def test_faulty_raises_on_about_the_requested_fraction():
  env = envs.make("faulty", env="keydoor", rate=0.2, seed=3)
  rng = random.Random(0)
  attempts = faults = 0
  episode = 0
  env.reset(episode)
  while attempts < 3000:
    attempts += 1
    turn = env.turn
    try:
      out = env.step(env.random_action(rng))
    except EnvError as e:
      faults += 1
      assert env.turn == turn and "injected fault" in str(e)  # the env did not move
      continue
    if out.terminated or out.truncated:
      episode += 1
      env.reset(episode)
  assert 0.17 < faults / attempts < 0.23


def test_faulty_is_seeded_and_clones_see_the_same_faults():
  def faults(env, seed):
    env.reset(seed)
    pattern = []
    while not env.done:
      try:
        env.step(env.expert_action())
        pattern.append(0)
      except EnvError:
        pattern.append(1)
    return pattern

  a = faults(envs.make("faulty", env="memory", env_kwargs={"length": 20}, rate=0.3), 1)
  b = faults(envs.make("faulty", env="memory", env_kwargs={"length": 20}, rate=0.3), 1)
  c = faults(envs.make("faulty", env="memory", env_kwargs={"length": 20}, rate=0.3, seed=1), 1)
  assert a == b and a != c and 0 < sum(a) < len(a)

  env = envs.make("faulty", env="memory", env_kwargs={"length": 20}, rate=0.3)
  env.reset(2)
  while env.turn < 5:
    try:
      env.step(env.expert_action())
    except EnvError:
      pass
  copies = [env, env.clone(), env.replay()]
  assert all(isinstance(c, wrappers.Faulty) for c in copies)
  results = []
  for c in copies:
    seq = []
    for _ in range(30):
      if c.done:
        break
      try:
        seq.append(continue_with(c, [c.expert_action()]))
      except EnvError:
        seq.append("fault")
    results.append(seq)
  assert results[0] == results[1] == results[2]


# -- latency ------------------------------------------------------------------


def test_latency_delays_are_heavy_tailed():
  for dist in ("lognormal", "pareto"):
    env = envs.make("latency", env="memory", median_s=1.0, dist=dist, cap_s=1e9)
    rng = random.Random(0)
    d = sorted(env.sample_delay(rng) for _ in range(20000))
    median, p99 = d[len(d) // 2], d[int(0.99 * len(d))]
    assert median == pytest.approx(1.0, rel=0.1)
    # An exponential with this median has p99 / median = log(100) / log(2) ~ 6.6.
    assert p99 / median > 8, (dist, p99 / median)
    capped = envs.make("latency", env="memory", median_s=1.0, dist=dist, cap_s=3.0)
    assert max(capped.sample_delay(rng) for _ in range(2000)) == 3.0


def test_latency_sleeps_seeded_delays():
  def run(seed):
    env = envs.make("latency", env="memory", env_kwargs={"length": 6}, median_s=0.002,
                    cap_s=0.02, seed=seed)
    env.reset(4)
    delays, start = [], time.perf_counter()
    while not env.done:
      delays.append(env.step(env.expert_action()).info["latency_s"])
    return delays, time.perf_counter() - start

  (a, elapsed), (b, _), (c, _) = run(0), run(0), run(1)
  assert a == b and a != c
  assert elapsed >= 0.95 * sum(a) and all(0 < x <= 0.02 for x in a)


def test_latency_uses_its_sleep_function():
  env = envs.make("latency", env="memory", median_s=0.5)
  slept = []
  env.sleep = slept.append  # no real waiting in this test
  _, success = run_episode(env, 0)
  assert success and len(slept) == env.turn and statistics.median(slept) < 10


def test_wrapped_env_instance_and_fresh_copy():
  inner = envs.make("keydoor", size=4)
  env = wrappers.wrap(inner, "latency", median_s=0.0)
  assert env.env is inner
  fresh = env.fresh()
  assert fresh.env is not inner and fresh.env.config == {"size": 4}
  assert run_episode(env, 3) == run_episode(fresh, 3)


def test_envs_package_does_not_import_jax():
  code = ("import sys, mtrl_jax.envs, mtrl_jax.envs.play; from mtrl_jax import envs; "
          "envs.make('memory'); envs.make('latency', env='repair'); "
          "assert 'jax' not in sys.modules, 'envs imported jax'")
  subprocess.run([sys.executable, "-c", code], check=True, env=_subprocess_env())


def _subprocess_env():
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_derive_seed_is_stable():
  assert envs.derive_seed("a", 1, 2) == envs.derive_seed("a", 1, 2)
  assert envs.derive_seed("a", 1, 2) != envs.derive_seed("a", 2, 1)
  assert 0 <= envs.derive_seed(0) < 2**63


def test_first_make_from_many_threads_at_once():
  # A fresh interpreter, so the built-ins are loaded by the racing threads themselves.
  code = """
import threading
from mtrl_jax.envs import registry
barrier, errors = threading.Barrier(16), []
def go(name):
  barrier.wait()
  try:
    registry.make(name).reset(0)
  except Exception as e:
    errors.append(repr(e))
threads = [threading.Thread(target=go, args=(["memory", "keydoor", "repair"][i % 3],))
           for i in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
assert not errors, errors
"""
  subprocess.run([sys.executable, "-c", code], check=True, env=_subprocess_env())
