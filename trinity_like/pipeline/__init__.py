"""Orchestration: the explore/train loop, evaluation, checkpoints and metrics."""
