#!/usr/bin/env bash
# The accelerator part of the long-session work, in one call: cuDNN attention
# against the reference (forward and gradients), then benchmarks/learner.py
# --run (tokens/s and MFU of the RL update at T=8k, the largest T that fits).
# Run from the repository root on a GPU machine whose python has jax with CUDA,
# flax, optax and chex (no install of mtrl_jax needed: PYTHONPATH=.).
#   bash benchmarks/device_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/device_check}}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 | tee -a "$out/gpu.txt"
JAX_PLATFORMS=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider tests/models/test_attention.py \
  -k "cudnn or gpu" 2>&1 | tail -n 15 | tee "$out/attention_tests.txt"
timeout "${LEARNER_TIMEOUT:-420}" python3 benchmarks/learner.py --run --skip-cpu-report \
  --max-t "${MAX_T:-131072}" 2>&1 | grep -v "^W0000\|^I0000" | tee "$out/learner_gpu.txt"
