"""What a checkpoint's state holds for the stage itself: where its data sources stand (the task
stream, the sample strategy, the expert rows) and the weights it has sent (:mod:`.weight_ledger`),
beside the step and whatever the loop keeps of its own (:class:`.steps.LoopState`).

:class:`Positions` writes them into the state a checkpoint saves and reads them back when a run
resumes; a position that does not load is one line naming the checkpoint and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.pipeline.weight_ledger import KEY as WEIGHTS_SENT

# what a checkpoint's state holds for the stage itself (the loop's own keys must differ)
STAGE_KEYS = ("step", "tasks", "strategy", "expert", WEIGHTS_SENT)
LOAD_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)


@dataclass
class Positions:
    """The stage's resumable parts; any of them may be None (a stage without expert rows, say)."""

    tasks: Any
    strategy: Any
    expert: Any
    ledger: Any

    def state(self, loop_state: dict[str, Any]) -> dict[str, Any]:
        """``loop_state`` with the positions beside it: what a checkpoint's ``state.json`` holds."""
        if clash := sorted(set(loop_state) & set(STAGE_KEYS)):
            raise ValueError(f"loop state keys {clash} are the stage's own")
        positions = {"tasks": self.tasks, "strategy": self.strategy, "expert": self.expert, WEIGHTS_SENT: self.ledger}
        return {**loop_state, **{k: None if v is None else v.state_dict() for k, v in positions.items()}}

    def restore(self, checkpoint: Path, state: dict[str, Any]) -> int:
        """Every position back from a checkpoint's ``state``; returns the step it was saved at."""
        for key, target in (("tasks", self.tasks), ("strategy", self.strategy), ("expert", self.expert)):
            if target is not None and state.get(key) is not None:
                try:
                    target.load_state_dict(state[key])
                except LOAD_ERRORS as exc:
                    raise TrinityError(
                        f"checkpoint {checkpoint}: state.json: its {key!r} position does not load ({first_line_of(exc)})"
                    ) from None
        if self.ledger is not None:
            self.ledger.load_state_dict(state.get(WEIGHTS_SENT))
        return int(state["step"])


def loop_state_of(state: dict[str, Any]) -> dict[str, Any]:
    """What the loop saved of its own in a checkpoint's ``state``."""
    return {k: v for k, v in state.items() if k not in STAGE_KEYS}


def first_line_of(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
