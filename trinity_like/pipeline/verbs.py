"""What a loop asks of a stage: :class:`StageVerbs`, the one contract the loops are typed against.

:mod:`.rl_loop`, :mod:`.async_loop`, :mod:`.offline_loop` and :mod:`.explorer_process` take a
``StageVerbs``, never the concrete :class:`~.stage.Stage`: what a loop may do with a stage is
what is written here, each member with a one-line contract. The stage's parts (its buffer,
its run directory, its data) stay behind these verbs, and so does the recipe: a loop reads
one thing directly, ``params`` (:class:`~.loop_params.LoopParams`), the recipe's values it
needs, built once with the stage. Like torchtune's recipe interface it is a contract to read
and to check against (``tests/pipeline/test_stage.py``), not a base class:
:class:`~.stage.Stage` implements it, and so may a test's or a benchmark's stand-in
(``tests/pipeline/test_loop_params.py`` holds one).

The verbs, grouped by who calls them:

===================  ========================================================================
explorer side        ``explore``, ``put``, ``receive_weights``, ``check_rewards``, ``evaluate``,
                     ``task_position``, ``restore_task_position``, ``writer_done``
trainer side         ``learner`` (the trainer's handle), ``next_batch`` (the batch source),
                     ``collate``, ``recorder``, ``trainer_computing``, ``sync_weights``,
                     ``name_weights``, ``lend_weights``
offline data         ``held_out_rows``, ``training_rows``, ``data_summary``, ``reference``,
                     ``decode``
run directory        ``log``, ``note``, ``advance`` (the logger), ``span``, ``add_span`` (the
                     timeline), ``file``, ``write_evals``, ``save_checkpoint``,
                     ``load_checkpoint``, ``memory``, ``has_eval``, ``close``
===================  ========================================================================
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from trinity_like.buffer.base import TrainingRecorder
    from trinity_like.experience import Experience
    from trinity_like.monitor.timeline import Span
    from trinity_like.pipeline.loop_params import LoopParams
    from trinity_like.pipeline.stage import Trainer
    from trinity_like.trainer.base import TrainEngine


class StageVerbs(Protocol):
    """The verbs a loop calls on a stage. Each docstring is the verb's whole contract."""

    @property
    def params(self) -> LoopParams:
        """What a loop reads of the recipe (steps, sync, evaluation, checkpoints), built once with the stage."""

    # -- explorer side -------------------------------------------------------------------
    def explore(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """Draw the next ``explorer.batch_size`` tasks, answer each ``group_size`` times, score: rows, metrics."""

    def put(self, rows: list[Experience], step: int) -> None:
        """Write step ``step``'s rows into the buffer under their rollout ids (explored again: kept once)."""

    def receive_weights(self, weights: Any, version: int) -> None:
        """The explorer samples with ``weights`` (a folder, a shared snapshot, tensors) as ``version`` from now on."""

    def check_rewards(self, tasks: int) -> dict[str, float] | None:
        """The learned reward against the gold one on ``tasks`` held-out tasks, its line written (None: no watch)."""

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out answer accuracy of the explorer's weights, answers logged under ``step`` ({}: no tasks)."""

    def task_position(self) -> dict[str, Any]:
        """Where the task order stands (what the next ``explore`` draws), to save."""

    def restore_task_position(self, state: dict[str, Any]) -> None:
        """Go back to a position :meth:`task_position` returned."""

    def writer_done(self) -> None:
        """Tell the buffer's readers that no more rows will come."""

    # -- trainer side ----------------------------------------------------------------------
    def learner(self) -> Trainer:
        """The trainer's handle: the actor (+ reference, critic) and their losses."""

    def next_batch(self, step: int, model_version: int) -> tuple[list[Any], dict[str, float]]:
        """Step ``step``'s training rows (buffer or training set) and what they lack (``skipped/*``); []: none."""

    def collate(self, rows: list[Any]) -> dict[str, torch.Tensor]:
        """``rows`` as one padded batch of tensors (pairs: chosen and rejected rows interleaved)."""

    def recorder(self) -> TrainingRecorder | None:
        """Where what the loss saw of each trained row is kept for people (None: nowhere)."""

    def trainer_computing(self) -> AbstractContextManager[None]:
        """Mark the trainer busy on the machine's CPU board for the body (the explorer takes its share only)."""

    def sync_weights(self, version: int) -> dict[str, float]:
        """The trainer's weights to the explorer as ``version`` (``train``: published); returns its parts' times."""

    def name_weights(self, version: int, weights: Any) -> None:
        """Record the identity of the weights sent as ``version``, which every trained row is checked against."""

    def lend_weights(self, version: int) -> None:
        """An offline stage's evaluator samples with the trainer's weights as ``version`` (no explorer: nothing)."""

    # -- offline data ------------------------------------------------------------------------
    def held_out_rows(self) -> list[Any]:
        """The offline held-out rows (``buffer.eval_data``: SFT rows or pairs; []: none)."""

    def training_rows(self) -> list[Any]:
        """Every row of the offline training set, in its file's order."""

    def data_summary(self) -> dict[str, float]:
        """Counts about the data logged at step 0 (pairs built from samples, ...; {}: none)."""

    def reference(self) -> TrainEngine:
        """The reference engine, built on first use when the stage does not hold one."""

    def decode(self, token_lists: list[list[int]]) -> list[str]:
        """The texts of ``token_lists``, special tokens left out."""

    # -- run directory, metrics and closing -----------------------------------------------
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step``'s metrics to every monitor (``metrics.jsonl``, TensorBoard, the progress bar)."""

    def note(self, line: str) -> None:
        """One line for people, on the console above the progress bar."""

    def advance(self, steps: int = 1) -> None:
        """Move the progress bar ``steps`` steps on."""

    def span(self, actor: str, phase: str, step: int) -> AbstractContextManager[None]:
        """Record the body as a span of ``actor`` in the run's timeline (none kept: nothing)."""

    def add_span(self, span: Span) -> None:
        """Record a span that already ended in the run's timeline (none kept: nothing)."""

    def file(self, name: str) -> Path:
        """The path of ``name`` in the run directory (``""``: the directory itself)."""

    def write_evals(self, step: int, items: list[dict[str, Any]], trained: bool = False) -> None:
        """Append ``items`` under ``step`` to ``evals.jsonl`` (``trained``: ``trained_pairs.jsonl``)."""

    def has_eval(self) -> bool:
        """Whether the stage holds held-out tasks or rows to evaluate."""

    def save_checkpoint(self, step: int, loop_state: dict[str, Any]) -> Path:
        """Weights, optimiser, data positions, RNG, ``loop_state`` after ``step``; then the buffer commits ``step``."""

    def load_checkpoint(self) -> tuple[int, dict[str, Any]]:
        """Restore the latest checkpoint, explorer weights too: ``(step, loop_state)``; ``(0, {})`` if none."""

    def memory(self) -> dict[str, float]:
        """Memory (GB) of this process, the trainer's workers and the explorer actor, and their total."""

    def close(self) -> None:
        """Free engines, explorer, Ray, CPU board, buffer and run directory (also after a partial build)."""
