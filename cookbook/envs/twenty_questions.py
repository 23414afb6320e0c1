"""The ``twenty_questions`` env: two models play a word-guessing game.

The host thinks of one word from a short list the player is shown ("cat, bread, lamp,
..."). Each turn the policy (the player) asks a yes/no question or guesses ("Is it a
lamp?"). A turn that names exactly one word of the list is a guess, judged by rule: right
ends the episode with reward ``1 - turn_penalty * (turn - 1)`` (fewer turns, more
reward), wrong gets "No, it is not lamp." (and reward ``-repeat_penalty`` when that word
was ruled out already). Any other question is answered by a frozen
**answerer model** -- the built-in model by default, prompted with the secret word and told
to answer Yes or No -- served by its own rollout engine (greedy, so a question asked twice
about one word gets one answer, which is cached). After ``max_turns`` turns without the
word the episode ends with reward 0. The host's replies are appended to the token history
under the chat template (token in, token out: see :mod:`.chat`) and carry no loss.

How good an answerer is the built-in model? Measured on 48 questions about 8 everyday
words ("Is it an animal?", "Can you eat it?" ...), SmolLM2-135M-Instruct's Yes-vs-No
logit difference separates true from false answers no better than chance (AUC 0.45-0.55
over four prompt formats; greedy, it says "No" to nearly everything). So with the default
answerer, questions carry almost no information, and what RL can teach the player is to
guess well: name words of the list, never the same one twice, early. With ``max_turns``
guesses among ``candidates`` words, a player that guesses distinct listed words in random
order wins ``max_turns / candidates`` of its games. A stronger answerer (any local Hugging
Face folder as ``answerer_model``) makes questions worth asking.

Words: :data:`TRAIN_WORDS` and :data:`HELD_OUT_WORDS` are disjoint; the ``twenty_questions``
task source draws a task's secret word and the other words of its list from its split's
pool, so held-out games never show a training word.

Metrics (per episode, averaged over episodes): ``env/solved`` (success rate),
``env/guesses`` (turns that named a listed word), ``env/repeats`` (guesses of a word
already ruled out), ``env/questions`` (turns the answerer model answered).

Example::

    factory = build_env_factory("twenty_questions", {"max_turns": 4}, tokenizer=tok)
    tasks = twenty_questions_tasks("train", 64, seed=0)
    dataset = TaskEnvDataset(tasks, factory, batch_size=8, group_size=8)
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from trinity_like.envs.dataset import TaskGroupBuilder
from trinity_like.envs.types import (
    Env,
    EnvFactory,
    EnvGroupBuilder,
    StepResult,
    StopCondition,
)
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.models.chat import Message, message_tokens, render_prompt
from trinity_like.registry import ENV, TASK_SOURCE

TRAIN_WORDS = (
    "cat",
    "dog",
    "horse",
    "cow",
    "bird",
    "fish",
    "apple",
    "banana",
    "orange",
    "bread",
    "cheese",
    "egg",
    "car",
    "bus",
    "boat",
    "train",
    "chair",
    "table",
    "bed",
    "lamp",
    "book",
    "pen",
    "cup",
    "phone",
)
HELD_OUT_WORDS = (
    "lion",
    "duck",
    "sheep",
    "frog",
    "grape",
    "lemon",
    "cake",
    "rice",
    "bike",
    "truck",
    "plane",
    "door",
    "clock",
    "shoe",
    "hat",
    "key",
)
WORDS = {"train": TRAIN_WORDS, "eval": HELD_OUT_WORDS}

PLAYER_SYSTEM_PROMPT = (
    "You are playing a guessing game. The host is thinking of one word from a list. Each turn, ask one "
    'yes/no question or guess with "Is it a WORD?". Find the word in as few turns as you can.'
)
EXAMPLE_WORDS = ("sun", "milk", "rock", "shirt")
"""The list of the worked example (``TwentyQuestionsParams.example``); none is in either pool."""
ANSWERER_PROMPT = (
    'You are the host of a guessing game. The secret word is "{word}". Answer the player\'s yes/no '
    "question about the secret word truthfully, with Yes or No."
)


def word_list(candidates: list[str] | tuple[str, ...]) -> str:
    """What a game is about: "I am thinking of one of these words: cat, cup, bed." """
    return f"I am thinking of one of these words: {', '.join(candidates)}."


def opening(candidates: list[str] | tuple[str, ...], max_turns: int) -> str:
    """The host's first message: the list and the number of turns."""
    return f"{word_list(candidates)} You have {max_turns} turns."


def example_conversation(max_turns: int) -> list[Message]:
    """One short game, played before the task: a question, a wrong guess, a right one."""
    return [
        {"role": "user", "content": opening(EXAMPLE_WORDS, max_turns)},
        {"role": "assistant", "content": "Can you drink it?"},
        {"role": "user", "content": "No."},
        {"role": "assistant", "content": "Is it a shirt?"},
        {"role": "user", "content": "No, it is not shirt."},
        {"role": "assistant", "content": "Is it a rock?"},
        {"role": "user", "content": "Yes! The word is rock."},
    ]


def named_words(text: str, candidates: list[str] | tuple[str, ...]) -> list[str]:
    """The listed words ``text`` names (whole words, any case, a plural 's' allowed), in list order.

    >>> named_words("Is it a Cat?", ["dog", "cat", "cup"]), named_words("cats or dogs?", ["dog", "cat"])
    (['cat'], ['dog', 'cat'])
    """
    return [w for w in candidates if re.search(rf"\b{re.escape(w)}s?\b", text, re.IGNORECASE)]


# -- the answerer ---------------------------------------------------------------------------------
class Answerer:
    """A frozen model that answers questions about a secret word: greedy, on its own engine.

    Questions asked at the same time (the games of a batch step together: the env declares
    ``concurrent_steps``) are answered in one engine call: the first asker waits
    ``window_s`` for the others, then generates every pending answer in one batch while
    later askers wait for the next. Answers are cached by (word, question): greedy decoding
    gives one answer to one prompt (up to near-ties that the batch's padding can flip).
    """

    def __init__(self, model_ref: str, *, max_tokens: int = 8, cache_size: int = 4096, window_s: float = 0.02) -> None:
        from trinity_like.config.schema import ExplorerConfig, field_default
        from trinity_like.explorer.engine_contract import EngineParams
        from trinity_like.explorer.engines import build_rollout_engine

        # The default rollout engine on the run's device (cluster.device; a GPU when torch sees one).
        self.engine = build_rollout_engine(
            field_default(ExplorerConfig, "engine"), model_ref, params=EngineParams(prefix_cache_tokens=0)
        )
        self.tokenizer = self.engine.tokenizer
        self.max_tokens = max_tokens
        self.window_s = window_s
        self.cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.cache_size = cache_size
        self.calls = 0  # answers generated (cache misses)
        self.batches = 0  # engine calls
        self._pending: dict[tuple[str, str], Future[str]] = {}
        self._busy = False  # an asker is generating a batch
        self._cond = threading.Condition()

    def answer(self, word: str, question: str) -> str:
        """The answerer's reply to ``question`` about ``word`` (one line, at most ``max_tokens``)."""
        key = (word, question.strip())
        with self._cond:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
            future = self._pending.setdefault(key, Future())
        while not future.done():
            with self._cond:
                if self._busy:  # someone else's batch is running: it may hold ours, or the next will
                    self._cond.wait(0.05)
                    continue
                self._busy = True
            try:
                time.sleep(self.window_s)  # let the other games of this turn ask too
                with self._cond:
                    batch = dict(self._pending)
                    self._pending.clear()
                self._generate(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        return future.result()

    def prompt(self, word: str, question: str) -> list[int]:
        """The answerer's prompt: the secret word in the system message, the question as the user's."""
        return render_prompt(
            self.tokenizer,
            [{"role": "system", "content": ANSWERER_PROMPT.format(word=word)}, {"role": "user", "content": question}],
        )

    @staticmethod
    def reply(text: str) -> str:
        """What the host says: the first line of the generated text (or "I don't know." when it is empty)."""
        return text.strip().split("\n")[0].strip() or "I don't know."

    def _generate(self, batch: dict[tuple[str, str], Future[str]]) -> None:
        from trinity_like.explorer.engine_contract import SamplingParams, generate

        if not batch:
            return
        keys = list(batch)
        try:
            prompts = [self.prompt(w, q) for w, q in keys]
            out = generate(self.engine, prompts, SamplingParams(greedy=True, max_new_tokens=self.max_tokens))
            texts = [self.tokenizer.decode(samples[0].token_ids, skip_special_tokens=True) for samples in out]
        except BaseException as exc:  # every asker of this batch sees the failure (its env step raises)
            for future in batch.values():
                future.set_exception(exc)
            raise
        with self._cond:
            self.calls += len(keys)
            self.batches += 1
            for key, text in zip(keys, texts):
                reply = self.reply(text)
                self.cache[key] = reply
                batch[key].set_result(reply)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)


_ANSWERERS: dict[tuple[str, int], Answerer] = {}
_ANSWERERS_LOCK = threading.Lock()


def shared_answerer(model_ref: str, max_tokens: int) -> Answerer:
    """One answerer per model and length per process: factories built again (a recipe's explorer,
    an evaluation) reuse its weights and cache."""
    with _ANSWERERS_LOCK:
        key = (str(model_ref), max_tokens)
        if key not in _ANSWERERS:
            _ANSWERERS[key] = Answerer(str(model_ref), max_tokens=max_tokens)
        return _ANSWERERS[key]


# -- the env --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TwentyQuestionsParams:
    """The game's limits, its reward shaping and the answerer."""

    max_turns: int = 4  # questions and guesses per episode; the episode ends after the last one
    max_tokens: int = 24  # most tokens of one question
    turn_penalty: float = 0.1  # a right guess at turn t is worth 1 - turn_penalty * (t - 1)
    repeat_penalty: float = 0.0  # reward of a turn that guesses a word already ruled out: -repeat_penalty
    answerer_model: str = "smollm2-135m-instruct"  # built-in id or local folder of the frozen answerer
    answerer_max_tokens: int = 8  # most tokens of one answer
    example: bool = True  # play the worked example game (example_conversation) before the task
    system_prompt: str = PLAYER_SYSTEM_PROMPT  # the player's instructions

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise TrinityError(f"TwentyQuestionsParams.max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 <= self.turn_penalty * (self.max_turns - 1) < 1.0:
            raise TrinityError(
                f"TwentyQuestionsParams.turn_penalty must be >= 0 and leave a right guess at turn max_turns "
                f"worth more than 0, got {self.turn_penalty} with max_turns={self.max_turns}"
            )
        if self.repeat_penalty < 0:
            raise TrinityError(f"TwentyQuestionsParams.repeat_penalty must be >= 0, got {self.repeat_penalty}")
        if self.answerer_max_tokens < 1:
            raise TrinityError(
                f"TwentyQuestionsParams.answerer_max_tokens must be >= 1, got {self.answerer_max_tokens}"
            )
        StopCondition(max_tokens=self.max_tokens)


class TwentyQuestionsEnv(Env):
    """One game: find ``word`` among ``candidates`` in at most ``max_turns`` turns."""

    concurrent_steps = True  # the games of a batch ask the answerer together: one engine call per turn

    def __init__(
        self,
        *,
        word: str,
        candidates: list[str],
        messages: list[Message],
        prompt: list[int],
        tokenizer: Any,
        answerer: Answerer,
        params: TwentyQuestionsParams,
    ) -> None:
        self.word = word
        self.candidates = candidates
        self.messages = list(messages)
        self.history = list(prompt)  # every token so far; only ever appended to
        self.tokenizer = tokenizer
        self.answerer = answerer
        self.params = params
        self.stop = StopCondition(max_tokens=params.max_tokens)
        self.turns = 0
        self.ruled_out: set[str] = set()

    def initial_observation(self) -> tuple[list[int], StopCondition]:
        return list(self.history), self.stop

    def step(self, action_tokens: list[int]) -> StepResult:
        self.turns += 1
        text = self.tokenizer.decode(action_tokens, skip_special_tokens=True).strip()
        named = named_words(text, self.candidates)
        guess = named[0] if len(named) == 1 else None
        repeat = guess is not None and guess in self.ruled_out
        metrics = {"guesses": float(guess is not None), "questions": float(guess is None), "repeats": float(repeat)}
        if guess == self.word:
            metrics["solved"] = 1.0
            return StepResult(1.0 - self.params.turn_penalty * (self.turns - 1), True, [], self.stop, metrics)
        reward = -self.params.repeat_penalty if repeat else 0.0
        if self.turns >= self.params.max_turns:
            metrics["solved"] = 0.0
            return StepResult(reward, True, [], self.stop, metrics)
        if guess is not None:
            self.ruled_out.add(guess)
            reply = f"No, it is not {guess}."
        else:  # a question (or several words at once): the answerer model's turn
            reply = self.answerer.answer(self.word, text)
        host = {"role": "user", "content": reply}
        delta = message_tokens(self.tokenizer, self.messages, [host], action_tokens=action_tokens)
        self.messages += [{"role": "assistant", "content": text}, host]
        self.history += list(action_tokens) + delta
        return StepResult(reward, False, list(self.history), self.stop, metrics)


@ENV.register_module("twenty_questions")
class TwentyQuestionsEnvs(EnvFactory):
    """A word-guessing game against a frozen answerer model (the built-in model by default)."""

    def __init__(self, *, tokenizer: Any, params: TwentyQuestionsParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self._answerer: Answerer | None = None

    def answerer(self) -> Answerer:
        """The frozen answerer, loaded at the first game (not when a recipe is validated)."""
        if self._answerer is None:
            self._answerer = shared_answerer(self.params.answerer_model, self.params.answerer_max_tokens)
        return self._answerer

    def group_builder(self, task: Task, group_size: int) -> EnvGroupBuilder:
        candidates = list(task.info.get("candidates") or ())
        if task.answer not in candidates:
            raise TrinityError(
                f"twenty_questions: task {task.task_id!r} needs info.candidates holding its answer {task.answer!r} "
                "(tasks of the twenty_questions task source have them)"
            )
        example = example_conversation(self.params.max_turns) if self.params.example else []
        system = [{"role": "system", "content": self.params.system_prompt}] if self.params.system_prompt else []
        messages = system + example + [{"role": "user", "content": opening(candidates, self.params.max_turns)}]
        prompt = render_prompt(self.tokenizer, messages)  # once per group: the envs share it
        answerer = self.answerer()

        def make_env() -> Env:
            return TwentyQuestionsEnv(
                word=task.answer,
                candidates=candidates,
                messages=messages,
                prompt=prompt,
                tokenizer=self.tokenizer,
                answerer=answerer,
                params=self.params,
            )

        return TaskGroupBuilder(task, group_size, make_env)


# -- tasks ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TwentyQuestionsTaskParams:
    """How a game's list is drawn."""

    candidates: int = 6  # words in a game's list, the secret one included

    def __post_init__(self) -> None:
        most = min(len(w) for w in WORDS.values())
        if not 2 <= self.candidates <= most:
            raise TrinityError(f"TwentyQuestionsTaskParams.candidates must be in 2..{most}, got {self.candidates}")


def twenty_questions_tasks(
    split: str, count: int, *, seed: int = 0, params: TwentyQuestionsTaskParams = TwentyQuestionsTaskParams()
) -> list[Task]:
    """``count`` games of ``split`` ("train": :data:`TRAIN_WORDS`, "eval": :data:`HELD_OUT_WORDS`):
    the secret words cycle through the pool in a seeded order, each with its own seeded list.

    >>> [t.answer in t.info["candidates"] for t in twenty_questions_tasks("eval", 3)]
    [True, True, True]
    """
    if split not in WORDS:
        raise TrinityError(f"unknown split {split!r} (splits: {', '.join(WORDS)})")
    pool = list(WORDS[split])
    rng = random.Random(f"twenty_questions|{seed}|{split}")
    tasks: list[Task] = []
    while len(tasks) < count:
        for word in rng.sample(pool, len(pool)):
            if len(tasks) == count:
                break
            others = rng.sample([w for w in pool if w != word], params.candidates - 1)
            candidates = others + [word]
            rng.shuffle(candidates)
            tasks.append(
                Task(
                    prompt=word_list(candidates),
                    answer=word,
                    task_id=f"20q-{split}-{seed}-{len(tasks)}",
                    info={"candidates": candidates},
                )
            )
    return tasks


@TASK_SOURCE.register_module("twenty_questions")
def twenty_questions_source(
    *, split: str, size: int | None, seed: int, system_prompt: str | None, params: TwentyQuestionsTaskParams
) -> list[Task]:
    """Word-guessing games: a secret word and the list it hides in (size None: each word of the split once)."""
    del system_prompt  # the env brings the player's instructions
    return twenty_questions_tasks(split, len(WORDS[split]) if size is None else size, seed=seed, params=params)
