"""Checking a learned reward against the task's verifier before RL (``trinity-like rm-check``)."""
