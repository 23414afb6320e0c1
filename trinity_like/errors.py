"""Exceptions a user is meant to read.

Every error that comes from bad input (a recipe, a data file, a plugin name) derives
from :class:`TrinityError`. The CLI prints such an error as one line and exits with
status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class TrinityError(Exception):
    """An error caused by input the user can fix; its message is one line."""


class ConfigError(TrinityError):
    """A recipe is malformed: names the file, the key path and the line."""


class DataError(TrinityError):
    """A data file is malformed: names the file and the line (``pairs.jsonl:17: ...``)."""


class PluginError(TrinityError):
    """A plugin could not be found or failed to import."""
