#!/usr/bin/env bash
# Wheels for the GPU machine (torch there, but no Hydra, no torchao, no network): writes them to
# gpu-wheels/ (git-ignored), which a device call carries and .ci/gpu-accept installs offline.
# The versions are the ones pyproject.toml pins; the GPU machine's Python is 3.12 on x86-64.
# Ray and MLflow stay behind: the engine runs under torchrun without them.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf gpu-wheels && mkdir gpu-wheels
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform any)
# torchao 0.18 loads its C++ kernels on torch >= 2.11 (its __init__ checks; the GPU machine had
# 2.11.0+cu130); FP8 training (Float8Linear) is Python over torch._scaled_mm and needs none of them.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d gpu-wheels torchao==0.18.0 hydra-core==1.3.8 omegaconf==2.3.1
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 requires) is published as a source archive
# only: build its pure-Python wheel here.
python3 -m pip wheel -q --no-deps -w gpu-wheels antlr4-python3-runtime==4.9.3
ls -l gpu-wheels
du -sh gpu-wheels
