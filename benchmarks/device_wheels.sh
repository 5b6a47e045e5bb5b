#!/usr/bin/env bash
# The Python packages the accelerator image lacks, as wheels for its python
# (CPython 3.12, x86-64 Linux), downloaded here into an ignored folder that a
# device call carries (docs/accelerator.md):
#   bash benchmarks/device_wheels.sh [DIR]        # default .device/wheels
#   TEXTWORLD=1 bash benchmarks/device_wheels.sh  # and TextWorld's (device_check.sh TEXTWORLD=1)
# The image has jax (CUDA), flax, optax, orbax, chex, numpy, torch,
# transformers, tokenizers and safetensors; what the README main job and the
# GGUF import need besides is below (shared/STACK.md, "On an NVIDIA GPU").
# Versions are the ones this project's CPU machines run. One version of each:
# two copies of a package stop the whole install there.
# On the device: python3 -m pip install -q --no-index --no-deps --no-compile \
#   --target /tmp/site DIR/*.whl && export PYTHONPATH=$PWD:/tmp/site
set -euo pipefail
dir=${1:-.device/wheels}
mkdir -p "$dir"
# Pure-Python or manylinux wheels for CPython 3.12.
WHEELS=(
  ml_collections==1.1.0 tensorflow-datasets==4.9.10 array_record==0.8.6 dm-tree==0.1.10
  importlib_resources==7.1.0 zipp==4.1.2 immutabledict==4.3.1 simple-parsing==0.1.9
  tensorflow-metadata==1.21.0 termcolor==3.3.0 toml==0.10.2 docstring_parser==0.18.0
  googleapis-common-protos==1.76.0 tensorboardX==2.6.5 gguf==0.19.0
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$dir" "${WHEELS[@]}"
# promise has no wheel on the index (sdist only): build one here, pure Python.
if ! ls "$dir"/promise-*.whl >/dev/null 2>&1; then
  python3 -m pip wheel -q --no-deps -w "$dir" promise==2.3
fi
# TEXTWORLD=1: also TextWorld and what it needs (~8.5 MiB; device_check.sh TEXTWORLD=1). jericho (its
# Z-machine interpreter) is an sdist only: built here into a py3-none-any wheel holding the
# libfrotz.so compiled for this x86-64 Linux (loaded through ctypes, so any CPython 3 takes it).
if [[ "${TEXTWORLD:-0}" == 1 ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" textworld==1.7.0 tatsu==5.8.3 hashids==1.3.1 mementos==1.3.1 \
    more_itertools==11.2.1 networkx==3.7 prompt_toolkit==3.0.53 wcwidth==0.9.4 tqdm==4.70.1
  if ! ls "$dir"/jericho-*.whl >/dev/null 2>&1; then
    python3 -m pip wheel -q --no-deps --no-build-isolation -w "$dir" jericho==3.3.1
  fi
fi
n=$(ls "$dir"/*.whl | wc -l)
bytes=$(du -cb "$dir"/*.whl | tail -n 1 | cut -f1)
echo "{\"wheels_dir\": \"$dir\", \"wheels\": $n, \"bytes\": $bytes, \"mib\": $(python3 -c "print(round($bytes / 2**20, 2))")}"
