"""The first-party algorithm pack registered, as its entry point does in an installed run."""

from __future__ import annotations

import algorithms  # noqa: F401  (registers the pack, as the entry point does)
