"""Programs end to end: train.py, the evals, the scripts and the launchers, run as processes."""
