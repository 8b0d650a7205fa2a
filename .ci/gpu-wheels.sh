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
# model=hf on the GPU (tests/gpu/test_gpu_hf.py): transformers and what importing it needs, pure Python
# but tokenizers, safetensors, hf_xet and regex (abi3 / cp312 wheels). numpy is torch's companion there;
# typer (transformers' CLI) and pydantic stay behind: importing the library does not need them.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d gpu-wheels transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 \
    huggingface_hub==1.33.0 hf_xet==1.8.0 regex==2026.11.19 tqdm==4.70.1 filelock fsspec==2026.6.0 \
    pyyaml packaging httpx==0.28.1 httpcore==1.0.9 h11 anyio idna certifi click typing_extensions
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 requires) is published as a source archive
# only: build its pure-Python wheel here.
python3 -m pip wheel -q --no-deps -w gpu-wheels antlr4-python3-runtime==4.9.3
ls -l gpu-wheels
du -sh gpu-wheels
