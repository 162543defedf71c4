"""Training: model and optimizer (build), batches (batching), the loop, checkpoints and signals."""
