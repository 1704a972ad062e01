#!/usr/bin/env bash
# Wheels the GPU machine lacks (it has Python 3.12, torch 2.11, numpy, pyyaml, tqdm, rich, pytest,
# hypothesis; no gymnasium, ale-py, tensordict or tyro), downloaded into .whl/ (git-ignored) on a machine with
# internet; copy the repository with .whl/ to the GPU machine and run bash benchmarks/gpu.sh there (it installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
for wheel in gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 tensordict==0.15.3 pyvers==0.2.3 \
             tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$wheel"
done
ls -la .whl
