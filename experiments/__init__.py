"""Experiments over the main job: sweeps, summaries, curves, and the credit-assignment study.

Run from the repository root as modules: `python -m experiments.sweep`, `python -m experiments.summarize`,
`python -m experiments.plot`, `python -m experiments.study` (experiments/README.md). They import the
package (mtrl_jax), never the reverse.
"""
