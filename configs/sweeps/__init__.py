"""Sweep files: `get_config(arg)` plus `sweep(arg)`, the overrides of each point (see
experiments/sweep.py)."""
