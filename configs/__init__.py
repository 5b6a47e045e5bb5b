"""Experiment configs: `get_config(arg)` per family; run from the repository root."""
