"""A staged, resumable fine-tuning pipeline built on Hugging Face Accelerate."""

from pathlib import Path

__version__ = "0.1.0"
REPO_ROOT = Path(__file__).resolve().parent.parent  # this checkout: what Ray workers put on sys.path, configs/
