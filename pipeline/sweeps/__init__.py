"""Hyperparameter sweeps (pipeline/sweep.py): the search space (space.py) and the Optuna study that runs the trials (study.py)."""
