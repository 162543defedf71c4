"""Corpora the project builds for itself (no hub): see long_reviews.py."""
