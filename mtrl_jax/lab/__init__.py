"""Measurement labs: tools that study the trainer's parts, never imported by train/."""
