#!/usr/bin/env bash
# Installs everything the pipeline, its tests and the embedded default need, at the tested versions.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first and pinned: an unpinned torch (or a package that depends on it) pulls a multi-GB CUDA build.
# On a GPU machine install the CUDA build of the same version first; this line then changes nothing.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -c constraints.txt -e ".[dev]"
