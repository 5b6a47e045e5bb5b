"""Many runs in one process (mtrl_jax/inprocess.py, mtrl_jax/compile/programs.py).

The quick tests check the shared programs piece by piece (sampler, sharded
init); the slow ones run the main job: several runs in one process, against
the same runs as separate `python -m mtrl_jax.main` processes.
"""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from mtrl_jax.compile import cache as compile_cache
from mtrl_jax.compile import counts, programs
from mtrl_jax.metrics import read_metrics
from mtrl_jax.models.config import ModelConfig
from mtrl_jax.models.transformer import Transformer
from mtrl_jax.parallel.mesh import make_mesh
from mtrl_jax.parallel.rules import DEFAULT_RULES
from mtrl_jax.parallel.sharded_init import ModelOf, create_sharded
from mtrl_jax.sampling.sampler import Sampler, SamplingParams

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
sys.path.insert(0, os.path.join(ROOT, "tests", "train"))

TINY = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32)


@pytest.fixture(autouse=True)
def programs_given_back():
  """The tests below empty the process-wide programs; after each, the worker gets back what it
  held, so later tests in this process do not compile again what earlier ones shared."""
  held = programs.held()
  yield
  programs.give_back(held)


@pytest.fixture
def no_persistent_cache():
  """Compile counts that mean compiling: the persistent cache (conftest's) off for the test."""
  old = jax.config.jax_compilation_cache_dir
  compile_cache.setup(None)
  yield
  compile_cache.setup(old)


def _compiled(fn):
  before = counts.compile_counts()
  out = fn()
  return out, counts.delta(before, counts.compile_counts()).compiled


def _play(sampler, seed=0):
  """(tokens, log-probs) of two rows after a prompt each, padded with -1 to one array."""
  state = sampler.init_state(2, 32)
  state = sampler.append(state, [[5, 6, 7], [8, 9]])
  out, _ = sampler.generate(state, jax.random.key(seed), 8, params=SamplingParams(temperature=1.0))
  tokens = np.full((2, 8), -1)
  logps = np.zeros((2, 8), np.float32)
  for b in range(2):
    tokens[b, :len(out.tokens[b])] = out.tokens[b]
    logps[b, :len(out.logps[b])] = out.logps[b]
  return tokens, logps


def test_second_sampler_of_equal_shapes_compiles_nothing_and_uses_its_own_weights(no_persistent_cache):
  """A second Sampler (another model's weights, same structure) reuses the first's programs: 0
  compiles, and its tokens are those a freshly built (cache-cleared) sampler gives for its weights.
  A sampler with other stop ids gets its own program. Catches: stop ids left out of the shared key
  (the third sampler then stops at the first one's ids: its tokens differ from a fresh one's), the
  programs not shared (the second sampler compiles), weights baked into the shared program."""
  programs.clear()
  a = Sampler.from_model(Transformer(TINY, rngs=nnx.Rngs(0)), pad_id=0, stop_ids=[1], log_compiles=False)
  first, n_first = _compiled(lambda: _play(a))
  b_model = Transformer(TINY, rngs=nnx.Rngs(1))
  b = Sampler.from_model(b_model, pad_id=0, stop_ids=[1], log_compiles=False)
  second, n_second = _compiled(lambda: _play(b))
  assert n_first > 0 and n_second == 0
  c_stops = [int(t) for t in np.unique(second[0][second[0] > 1])[:3]]  # ids the second sampler drew
  assert c_stops
  c = Sampler.from_model(b_model, pad_id=0, stop_ids=c_stops, log_compiles=False)
  third, _ = _compiled(lambda: _play(c))
  programs.clear()  # the references: built from nothing
  fresh_b = _play(Sampler.from_model(b_model, pad_id=0, stop_ids=[1], log_compiles=False))
  fresh_c = _play(Sampler.from_model(b_model, pad_id=0, stop_ids=c_stops, log_compiles=False))
  np.testing.assert_array_equal(second[0], fresh_b[0])
  np.testing.assert_allclose(second[1], fresh_b[1], rtol=1e-6)
  assert not np.allclose(first[1], second[1])  # another model: other log-probs
  np.testing.assert_array_equal(third[0], fresh_c[0])
  assert not np.array_equal(third[0], second[0])  # the stop ids changed what was generated


def test_seeded_sharded_init_is_shared_across_seeds_with_each_seeds_values(no_persistent_cache):
  """create_sharded(ModelOf(...), seed=...) gives the values of the unshared init with nnx.Rngs(seed),
  and a second seed with an equal factory compiles nothing. Catches: the seed baked into the shared
  program (seed 1 would get seed 0's weights), the program not shared (seed 1 compiles)."""
  programs.clear()
  mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = DEFAULT_RULES

  def make(seed):
    return create_sharded(ModelOf(Transformer, TINY), mesh, rules, seed=seed)

  m0, n0 = _compiled(lambda: make(0))
  m1, n1 = _compiled(lambda: make(1))
  assert n0 > 0 and n1 == 0
  for seed, got in ((0, m0), (1, m1)):
    # The unshared init (the seed a constant of its program): the same values, bit for bit.
    want = nnx.state(create_sharded(lambda: Transformer(TINY, rngs=nnx.Rngs(seed)), mesh, rules))
    for (p, w), (_, g) in zip(nnx.to_flat_state(want), nnx.to_flat_state(nnx.state(got))):
      np.testing.assert_array_equal(np.asarray(g.get_value()), np.asarray(w.get_value()), err_msg=str(p))


# ------------------------------------------------------------------ the main job, several runs
SMALL = ["--config.model.n_layers=1", "--config.model.dim=32", "--config.model.mlp_dim=64",
         "--config.model.head_dim=8", "--config.demos.episodes=16", "--config.rollout.context_cap=192",
         "--config.sft.steps=2", "--config.rl.steps=2", "--config.eval.tasks=2", "--config.eval.greedy=False",
         "--config.rl.group_size=2", "--config.stages=('demos','sft','rl')", "--config.checkpoint.every=1",
         "--config.checkpoint.async_save=false"]


def _argv(seed, workdir):
  return [f"--config=configs/default.py:runlocal=true,seed={seed}", *SMALL, f"--workdir={workdir}"]


def _env():
  from main_helpers import env_one_device
  env = env_one_device()
  env["MTRL_COMPILE_CACHE"] = ""  # config.compile_cache 'auto' -> off: the counts mean compiling
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Seed 0 then seed 1 in one process; seed 1 again there, interrupted in its second RL update,
  then resumed (its workdir relaunched); seed 1 as its own `python -m mtrl_jax.main` process."""
  tmp = tmp_path_factory.mktemp("inprocess")
  d = {k: str(tmp / k) for k in ("seed0", "seed1", "resumed", "process")}
  spec = {"jobs": [_argv(0, d["seed0"]), _argv(1, d["seed1"]), _argv(1, d["resumed"]), _argv(1, d["resumed"])],
          "fail": {"job": 2, "update": 2}}
  # As a module from the checkout's root: the worker imports this checkout's package (and configs/).
  p = subprocess.run([sys.executable, "-m", "tests.experiments.inprocess_worker", json.dumps(spec)], cwd=ROOT,
                     env=_env(), capture_output=True, text=True, timeout=1800)
  assert p.returncode == 0, p.stderr[-3000:]
  jobs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"job"')]
  ref = subprocess.run([sys.executable, "-m", "mtrl_jax.main", *_argv(1, d["process"])], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=1800)
  assert ref.returncode == 0, ref.stderr[-3000:]
  return d, jobs


def _timing(k: str) -> bool:
  return k.startswith(("time/", "compile/")) or k.endswith(("seconds", "_s"))


def _records(workdir):
  """The last record of each (stage, step), without wall-clock and compile numbers."""
  out = {}
  for r in read_metrics(workdir):
    if r["stage"] != "compile":
      out[(r["stage"], r["step"], tuple(sorted(k for k in r if k.startswith("eval/"))))] = {
          k: v for k, v in r.items() if not _timing(k)}
  return out


def _assert_same_records(a, b):
  """Equal keys; numbers equal to float32 rounding, everything else (None, text) exactly."""
  assert a.keys() == b.keys()
  for k in a:
    assert a[k].keys() == b[k].keys(), k
    for name, x in a[k].items():
      y = b[k][name]
      if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        assert x == pytest.approx(y, rel=1e-6, abs=1e-7), (k, name)
      else:
        assert x == y, (k, name)


def _final_state(workdir):
  from test_main_e2e import _final_state as final, _flat
  return _flat(final(workdir))


def _assert_same_state(a, b):
  """Same leaves; arrays equal to float32 rounding, empty (None) leaves on both sides."""
  assert a.keys() == b.keys() and len(a) > 10
  for k in a:
    if a[k].dtype == object or b[k].dtype == object:
      assert a[k].tolist() == b[k].tolist(), k
    else:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.slow
def test_second_run_in_one_process_compiles_nothing(runs):
  """N runs of equal shapes in one process compile once: the first run compiles, the second
  (another seed), the interrupted one and its resumption compile 0 programs (persistent cache
  off). Catches any jitted step rebuilt per run: e.g. optim.adamw not memoised (checked: the
  later runs then compiled 4, 4 and 2 programs), the sampler's closures built per Sampler (before
  this change a second run compiled 34)."""
  _, jobs = runs
  assert [j["rc"] for j in jobs] == [0, 0, 1, 0]
  assert jobs[0]["compiled"] > 10 and jobs[0]["cache_hits"] == 0
  assert [j["compiled"] for j in jobs[1:]] == [0, 0, 0]


@pytest.mark.slow
def test_in_process_run_gives_what_its_own_process_gives(runs):
  """The second run of the process (seed 1) writes the metrics (every number but times and
  compile counts) and final checkpoint its own process writes for seed 1. Catches a shared
  program that keeps the first run's values: e.g. the seeded init closing over the first seed
  (checked: seed 1 then starts from seed 0's weights; its sft loss differs), global state leaking
  between runs."""
  d, _ = runs
  a, b = _records(d["seed1"]), _records(d["process"])
  assert len(a) >= 5
  _assert_same_records(a, b)
  sa = _final_state(d["seed1"])
  _assert_same_state(sa, _final_state(d["process"]))
  s0 = _final_state(d["seed0"])
  assert any(not np.array_equal(s0[k], sa[k]) for k in sa)  # seeds differ: the comparison can fail


@pytest.mark.slow
def test_interrupted_run_resumed_in_process_matches_its_own_process(runs):
  """A run interrupted in its second RL update (after the step-1 checkpoint) and relaunched in the
  same process resumes from the checkpoint and ends where the uninterrupted separate process
  ends: the same metrics and final checkpoint. Catches a relaunch that ignores the workdir's
  checkpoint (checked: Run.__init__ not restoring it, the log then lacks "resumed from checkpoint")
  and a resumed state that differs from the uninterrupted one."""
  d, _ = runs
  with open(os.path.join(d["resumed"], "log.txt")) as f:
    assert "resumed from checkpoint" in f.read()
  _assert_same_records(_records(d["resumed"]), _records(d["process"]))
  _assert_same_state(_final_state(d["resumed"]), _final_state(d["process"]))


# ------------------------------------------------------------------ the launchers' --in_process
def test_sweep_in_process_runs_the_commands_it_would_launch(tmp_path, monkeypatch, capsys):
  """`sweep.py --in_process` hands the runner exactly the flags its subprocess command carries
  (config with the grid point, overrides, workdir), one run per grid point, each logging to its
  workdir's log.txt. Catches a flag dropped on the in-process path (checked: the workdir) and
  runs still launched as processes (checked: --in_process ignored)."""
  from experiments import sweep
  from mtrl_jax import inprocess
  got = []
  monkeypatch.setattr(inprocess, "run_argv", lambda argv, log_path=None: (got.append((argv, log_path)), (0, 0.0))[1])
  monkeypatch.setattr(sweep, "run_one", lambda *a: pytest.fail("a subprocess was launched"))
  root = str(tmp_path / "sweep")
  args = ["--config", "configs/default.py:runlocal=true", "--grid", "seed=0,1", "--root", root,
          "--config.rl.steps=5"]
  assert sweep.main([*args, "--in_process"]) == 0
  want = [sweep.command("py", "configs/default.py:runlocal=true,seed=" + s, os.path.join(root, "seed=" + s),
                        ["--config.rl.steps=5"])[1:] for s in "01"]
  want = [w[w.index("mtrl_jax.main") + 1:] for w in want]
  assert [g[0] for g in got] == want
  assert [g[1] for g in got] == [os.path.join(root, f"seed={s}", "log.txt") for s in "01"]
  with pytest.raises(SystemExit):
    sweep.main([*args, "--in_process", "--parallel", "2"])


def test_study_in_process_runs_main_jobs_here_and_the_lab_in_its_own_process(tmp_path, monkeypatch):
  """The study's pool with in_process: a main-job command runs through the in-process runner with
  its flags, a lab command (not the main job) still as a process; finished runs get wall.json.
  Catches the lab pushed through the main-job runner, or in_process ignored."""
  from experiments import sweep
  from experiments.study import records, runner
  from mtrl_jax import inprocess
  ran_here, ran_apart = [], []
  monkeypatch.setattr(inprocess, "run_argv", lambda argv, log_path=None: (ran_here.append(argv), (0, 1.5))[1])

  def run_one(name, cmd, workdir):  # a process's run, recorded
    os.makedirs(workdir, exist_ok=True)
    ran_apart.append(cmd)
    return name, 0, 2.0

  monkeypatch.setattr(sweep, "run_one", run_one)
  main_wd, lab_wd = str(tmp_path / "run"), str(tmp_path / "lab")
  jobs = [("run", ["py", "-m", "mtrl_jax.main", "--config=configs/study.py:x", f"--workdir={main_wd}"], main_wd),
          ("lab", ["py", "-m", "mtrl_jax.lab.credit_accuracy", "--config=configs/lab.py", f"--workdir={lab_wd}"],
           lab_wd)]
  assert runner._pool(jobs, 1, "run", in_process=True) == []
  assert ran_here == [["--config=configs/study.py:x", f"--workdir={main_wd}"]]
  assert ran_apart == [jobs[1][1]]
  with open(os.path.join(main_wd, "wall.json")) as f:
    assert json.load(f) == {"wall_s": 1.5, "machine": records.machine()}
