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


class WorkerDiedError(TrinityError):
    """A process the run started and waits on -- a verl worker, the explorer actor -- ended.

    ``what`` says which and while doing what (one line, no advice); ``part`` is the side it
    served (``"trainer"`` or ``"explorer"``); ``aftermath`` what the driver did about it.
    The run restarts the stage from its latest checkpoint up to ``trainer.max_restarts``
    times (:mod:`trinity_like.pipeline.restart`); past that the message, which says how to
    resume by hand, ends the run.
    """

    def __init__(self, what: str, part: str, aftermath: str = "") -> None:
        done = f"; {aftermath}" if aftermath else ""
        super().__init__(f"{what}{done}: run the same command to resume from the latest checkpoint")
        self.what = what
        self.part = part
        self.aftermath = aftermath
