"""A staged, resumable fine-tuning pipeline built on Hugging Face Accelerate."""

__version__ = "0.1.0"
