"""Evaluation: load a trained checkpoint, predict a prepared split, score it, write the report."""
