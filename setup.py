"""mtrl_jax: multi-turn RL for language-model agents in JAX."""
from setuptools import find_packages, setup

# Loading HF folders, the transformers oracle, GGUF import (gguf dequantizes;
# accelerate is what transformers needs to read a GGUF in the tests), chat
# templates (jinja2) and tokenizer.json files (tokenizers).
HF = ["torch==2.13.0", "transformers>=4.44", "safetensors>=0.4", "tokenizers>=0.19", "jinja2>=3.1.6",
      "gguf>=0.10", "accelerate>=0.30"]
TEXTARENA = ["textarena>=0.7"]
# The field's own tasks (envs/textworld, envs/babyai): TextWorld ships its Inform 7 compiler,
# minigrid the BabyAI levels and their bot. Both run offline.
BENCHMARKS = ["textworld>=1.7", "minigrid>=3.2"]
# Accelerators: the jax extras JAX's install guide names (`pip install -e ".[dev]"`
# alone gives the CPU jaxlib). Each pulls jaxlib's matching plugin and, for
# NVIDIA, the CUDA and cuDNN libraries as wheels, so no system CUDA is needed.
# jax[cuda13] wants an NVIDIA driver >= 580; an older driver takes the CUDA 12 build.
GPU = ["jax[cuda13]>=0.7"]
GPU_CUDA12 = ["jax[cuda12]>=0.7"]
TPU = ["jax[tpu]>=0.7"]

setup(
    name="mtrl_jax",
    version="0.1.0",
    description="Multi-turn reinforcement learning of language-model agents in JAX, "
    "built to study long-horizon credit assignment.",
    packages=find_packages(include=["mtrl_jax", "mtrl_jax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7",
        "flax>=0.12",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "chex>=0.1.90",
        "ml-collections>=1.0",
        "tensorflow-datasets>=4.9.9",
        "array_record>=0.7",
        "importlib_resources",
        "absl-py>=2.0",
        "numpy>=1.26",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
    ],
    extras_require={
        "hf": HF,
        "textarena": TEXTARENA,
        "benchmarks": BENCHMARKS,
        "gpu": GPU,
        "cuda12": GPU_CUDA12,
        "tpu": TPU,
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "rlax>=0.1.6",
                "mutmut>=3.8", "peft>=0.13"]
        + HF
        + TEXTARENA
        + BENCHMARKS,
    },
)
