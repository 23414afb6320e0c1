"""Renderers: chat messages <-> the exact token ids a chat model sees.

A renderer owns one chat format. It builds the prompt to sample from
(``build_generation_prompt``), says where sampling stops (``get_stop_sequences``), turns
sampled tokens back into a message (``parse_response``) and builds a supervised example with
per-token loss weights (``build_supervised_example``). The semantics follow tinker-cookbook's
renderers; the code is our own.

A renderer is a format, not a tokeniser: it writes text pieces (BOS, each message's header,
each message's body, the generation suffix) and :mod:`trinity_like.models.chat`, the one
owner of chat tokenisation, encodes them one by one (:func:`~trinity_like.models.chat.encode_pieces`)
-- never by re-tokenising the whole rendered string -- so the boundary between prompt and
completion, and between trained and untrained tokens, is exact. A message's *header* is its
role framing (never trained except under ``all_tokens``); its *body* is its content plus the
end-of-turn token.

The names (``RENDERER``): ``role_colon``, ``llama3``, ``qwen3``, ``qwen3_disable_thinking``,
``chatml`` (plain ChatML: the messages as given, nothing added) and ``smollm2`` (ChatML plus
SmolLM2's default system prompt when the conversation opens without one, as SmolLM2's own
chat template does). ``docs/client.md`` ("Renderers") says exactly what each one writes.

Example (any tokenizer with ``<|im_start|>``/``<|im_end|>``, e.g. SmolLM2's)::

    from trinity_like.client.renderers import get_renderer
    from trinity_like.models.resolve import load_tokenizer

    renderer = get_renderer("chatml", load_tokenizer("smollm2-135m-instruct"))
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "Hi"}])
    prompt.to_ints()[-4:]          # [1, 520, 9531, 198]:  '<|im_start|>assistant\\n'
    renderer.get_stop_sequences()  # [2]  (<|im_end|>)
    renderer.parse_response([19556, 2])  # ({'role': 'assistant', 'content': 'Hello'}, True)
    tokens, weights = renderer.build_supervised_example(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        "last_assistant_message")  # weights 1 on 'Hello<|im_end|>', 0 elsewhere
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tinker
import torch

from trinity_like.models.chat import Message, encode_pieces, encode_text, single_token_id

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system prompt SmolLM2's built-in chat template adds when the first message is not one
(the ``smollm2`` renderer adds it too; ``chatml`` never does)."""


class TrainOnWhat(str, enum.Enum):
    """Which tokens of a conversation get loss weight 1 (tinker-cookbook's names).

    Headers (role framing) and BOS get weight 1 only under ``ALL_TOKENS``.
    """

    LAST_ASSISTANT_MESSAGE = "last_assistant_message"  # the final message, which must be the assistant's
    LAST_ASSISTANT_TURN = "last_assistant_turn"  # the assistant messages after the last user message
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"  # every assistant message
    ALL_MESSAGES = "all_messages"  # every message body, whatever its role
    ALL_TOKENS = "all_tokens"  # everything, headers and BOS included
    ALL_USER_AND_SYSTEM_MESSAGES = "all_user_and_system_messages"  # user and system bodies only


@dataclass(frozen=True)
class Segment:
    """A piece of text in a render: ``kind`` is "frame" (BOS, generation suffix), "header" or
    "body" (a stop overlap is the last message's body); ``index`` is the message it belongs to
    (-1 for a frame)."""

    text: str
    kind: str
    index: int = -1


def last_user_index(messages: Sequence[Message]) -> int:
    """The index of the last user message, or -1 when there is none."""
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)


def _is_trained(messages: Sequence[Message], index: int, what: TrainOnWhat) -> bool:
    """Whether the body of ``messages[index]`` gets weight 1 under ``what``."""
    role = messages[index]["role"]
    if what in (TrainOnWhat.ALL_TOKENS, TrainOnWhat.ALL_MESSAGES):
        return True
    if what is TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES:
        return role in ("user", "system")
    if role != "assistant":
        return False
    if what is TrainOnWhat.ALL_ASSISTANT_MESSAGES:
        return True
    if what is TrainOnWhat.LAST_ASSISTANT_TURN:
        return index > last_user_index(messages)
    return index == len(messages) - 1  # LAST_ASSISTANT_MESSAGE


class Renderer(abc.ABC):
    """One chat format. Subclasses define ``_header``, ``_body`` and ``_suffix`` (as text)
    and the stop handling; this class turns them into tokens, prompts and weighted examples."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    # -- the format: subclasses override these -------------------------------------------------
    def _bos(self) -> str:
        """The special token that opens every sequence, as text (none by default)."""
        return ""

    def _prepare(self, messages: Sequence[Message]) -> list[Message]:
        """The messages actually rendered (a format may add a default system prompt)."""
        return list(messages)

    @abc.abstractmethod
    def _header(self, messages: Sequence[Message], index: int) -> str:
        """Message ``index``'s role framing (never trained except under ``all_tokens``)."""

    @abc.abstractmethod
    def _body(self, messages: Sequence[Message], index: int) -> str:
        """Message ``index``'s content and its end-of-turn token."""

    @abc.abstractmethod
    def _suffix(self, messages: Sequence[Message]) -> str:
        """The text that opens the assistant turn to be sampled."""

    def _stop_overlap(self) -> str:
        """Text that completes a string stop sequence after the last message (role_colon)."""
        return ""

    @abc.abstractmethod
    def get_stop_sequences(self) -> list[int] | list[str]:
        """Token ids (or strings) at which sampling stops: the end of the assistant turn."""

    @abc.abstractmethod
    def parse_response(self, tokens: Sequence[int]) -> tuple[Message, bool]:
        """``(assistant message, ok)``; ``ok`` is False when the turn did not end cleanly."""

    # -- shared machinery ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """``text``'s token ids (:func:`~trinity_like.models.chat.encode_text`: no BOS/EOS added)."""
        return encode_text(self.tokenizer, text)

    def token_id(self, text: str) -> int:
        """The id of a special token that must encode to exactly one id."""
        return single_token_id(self.tokenizer, text)

    def segments(self, messages: Sequence[Message]) -> list[Segment]:
        """BOS, then each message's header and body, as text pieces."""
        out = [Segment(self._bos(), "frame")]
        for index in range(len(messages)):
            out.append(Segment(self._header(messages, index), "header", index))
            out.append(Segment(self._body(messages, index), "body", index))
        return [s for s in out if s.text]

    def build_generation_prompt(self, messages: Sequence[Message]) -> tinker.types.ModelInput:
        """The tokens to sample the next assistant message from.

        >>> get_renderer("role_colon", tok).build_generation_prompt(
        ...     [{"role": "user", "content": "Hi"}])  # decodes to 'User: Hi\\n\\nAssistant:'
        """
        messages = self._prepare(messages)
        pieces = [s.text for s in self.segments(messages)] + [self._suffix(messages)]
        ids, _ = encode_pieces(self.tokenizer, [(text, False) for text in pieces])
        return tinker.types.ModelInput.from_ints(ids)

    def build_supervised_example(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE
    ) -> tuple[tinker.types.ModelInput, torch.Tensor]:
        """``(tokens, weights)``: weights is a float32 tensor as long as the tokens, 1 exactly
        on the tokens trained on (see :class:`TrainOnWhat`).

        >>> model_input, weights = renderer.build_supervised_example(
        ...     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        ...     "last_assistant_message")  # 1 on 'Hello' and the end-of-turn token
        """
        what = TrainOnWhat(train_on_what)
        messages = self._prepare(messages)
        if what is TrainOnWhat.LAST_ASSISTANT_MESSAGE and (not messages or messages[-1]["role"] != "assistant"):
            raise ValueError("train_on_what='last_assistant_message' needs the last message to be the assistant's")
        segments = self.segments(messages)
        if messages:
            segments.append(Segment(self._stop_overlap(), "body", len(messages) - 1))
        ids, trained = encode_pieces(
            self.tokenizer,
            [
                (s.text, _is_trained(messages, s.index, what) if s.kind == "body" else what is TrainOnWhat.ALL_TOKENS)
                for s in segments
            ],
        )
        return tinker.types.ModelInput.from_ints(ids), torch.tensor(trained, dtype=torch.float32)


class StopTokenRenderer(Renderer):
    """A format whose assistant turn ends with one special token (``end_token``)."""

    end_token = ""

    def get_stop_sequences(self) -> list[int]:
        """``[id of end_token]``."""
        return [self.token_id(self.end_token)]

    def parse_response(self, tokens: Sequence[int]) -> tuple[Message, bool]:
        """The text before the first end token; ok when that token is the last one.

        >>> renderer.parse_response(renderer.encode("Hello<|im_end|>"))
        ({'role': 'assistant', 'content': 'Hello'}, True)
        """
        tokens = list(tokens)
        stop = self.token_id(self.end_token)
        end = tokens.index(stop) if stop in tokens else len(tokens)
        content = self.tokenizer.decode(tokens[:end])
        return {"role": "assistant", "content": content}, end == len(tokens) - 1


class RoleColonRenderer(Renderer):
    """``User: ...\\n\\nAssistant: ...\\n\\n`` (the DeepSeek R1-Zero style, for base models).

    Sampling stops at the string ``"\\n\\nUser:"``; a supervised example ends with ``User:``
    (trained like the last message) so the model learns to emit the whole stop sequence.

    >>> r = RoleColonRenderer(tok)
    >>> tok.decode(r.build_generation_prompt([{"role": "user", "content": "Hi"}]).to_ints())
    'User: Hi\\n\\nAssistant:'
    """

    stop = "\n\nUser:"

    def _bos(self) -> str:
        # Only where the tokenizer itself opens every sequence with BOS (Llama base models).
        bos, ids = self.tokenizer.bos_token_id, self.tokenizer.encode("a", add_special_tokens=True)
        return self.tokenizer.bos_token if bos is not None and ids and ids[0] == bos else ""

    def _header(self, messages: Sequence[Message], index: int) -> str:
        return messages[index]["role"].capitalize() + ":"

    def _body(self, messages: Sequence[Message], index: int) -> str:
        return " " + messages[index]["content"] + "\n\n"

    def _suffix(self, messages: Sequence[Message]) -> str:
        return "Assistant:"

    def _stop_overlap(self) -> str:
        return "User:"

    def get_stop_sequences(self) -> list[str]:
        """``["\\n\\nUser:"]``."""
        return [self.stop]

    def parse_response(self, tokens: Sequence[int]) -> tuple[Message, bool]:
        """Text up to ``"\\n\\nUser:"``; ok when the response ends with it, once (or ends
        with EOS and holds no stop sequence).

        >>> r.parse_response(tok.encode(" Hello\\n\\nUser:"))
        ({'role': 'assistant', 'content': 'Hello'}, True)
        """
        tokens = list(tokens)
        eos = self.tokenizer.eos_token_id
        ended_with_eos = bool(tokens) and eos is not None and tokens[-1] == eos
        text = self.tokenizer.decode(tokens[:-1] if ended_with_eos else tokens)
        pieces = text.split(self.stop)
        content = pieces[0].removeprefix(" ").removesuffix("\n\n")
        ok = (len(pieces) == 2 and pieces[1] == "" and not ended_with_eos) or (len(pieces) == 1 and ended_with_eos)
        return {"role": "assistant", "content": content}, ok


class Llama3Renderer(StopTokenRenderer):
    """Llama 3 Instruct: ``<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\\n\\n
    {content}<|eot_id|>...`` (like tinker-cookbook, without HF's "Cutting Knowledge Date"
    system preamble of Llama 3.1+).

    >>> r = Llama3Renderer(tok)  # tok must have the Llama 3 special tokens
    >>> r.get_stop_sequences() == [tok.convert_tokens_to_ids("<|eot_id|>")]
    True
    """

    end_token = "<|eot_id|>"

    def _bos(self) -> str:
        self.token_id("<|begin_of_text|>")  # a tokenizer without it is an error here, not a silent split
        return "<|begin_of_text|>"

    def _header(self, messages: Sequence[Message], index: int) -> str:
        return f"<|start_header_id|>{messages[index]['role']}<|end_header_id|>\n\n"

    def _body(self, messages: Sequence[Message], index: int) -> str:
        return messages[index]["content"] + self.end_token

    def _suffix(self, messages: Sequence[Message]) -> str:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n"


class ChatMLRenderer(StopTokenRenderer):
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. With ``default_system``, that
    system message is put first when the first message is not a system one (SmolLM2's
    template: the ``smollm2`` renderer); without it (``chatml``), nothing is added.

    The newline after ``<|im_end|>`` opens the next header, so a body ends with the stop token.

    >>> r = ChatMLRenderer(tok, default_system=SMOLLM2_SYSTEM)
    >>> text = tok.decode(r.build_generation_prompt([{"role": "user", "content": "Hi"}]).to_ints())
    >>> text.endswith("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n")
    True
    """

    end_token = "<|im_end|>"

    def __init__(self, tokenizer: Any, default_system: str | None = None) -> None:
        super().__init__(tokenizer)
        self.default_system = default_system

    def _prepare(self, messages: Sequence[Message]) -> list[Message]:
        messages = list(messages)
        if self.default_system is not None and messages and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.default_system})
        return messages

    def _header(self, messages: Sequence[Message], index: int) -> str:
        return ("\n" if index > 0 else "") + f"<|im_start|>{messages[index]['role']}\n"

    def _body(self, messages: Sequence[Message], index: int) -> str:
        return messages[index]["content"] + self.end_token

    def _suffix(self, messages: Sequence[Message]) -> str:
        return ("\n" if messages else "") + "<|im_start|>assistant\n"


def split_thinking(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of an assistant text, the way Qwen3's template splits it.

    >>> split_thinking("<think>\\n2+2 is 4\\n</think>\\n\\n4")
    ('2+2 is 4', '4')
    >>> split_thinking("4")
    ('', '4')
    """
    if "</think>" not in content:
        return "", content
    after = content.split("</think>")[-1]
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning.strip("\n"), after.lstrip("\n")


class Qwen3Renderer(ChatMLRenderer):
    """Qwen3 with thinking (HF's template, ``enable_thinking=True``): an assistant message
    after the last user message is written ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``
    (an empty block when it is the last message and did not reason); earlier assistant
    messages lose their reasoning, as the template drops it from history.

    Because history loses its reasoning, ``all_assistant_messages`` trains earlier turns on a
    context the model never saw while producing them (no "extension property"); prefer one
    example per assistant turn with ``last_assistant_message``.

    >>> r = Qwen3Renderer(tok)
    >>> r.parse_response(tok.encode("<think>\\nhm\\n</think>\\n\\n4<|im_end|>"))
    ({'role': 'assistant', 'content': '<think>\\nhm\\n</think>\\n\\n4'}, True)
    """

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, default_system=None)

    def _framed(self, messages: Sequence[Message], index: int) -> bool:
        """Whether this assistant message is written with its think block."""
        reasoning, _ = split_thinking(messages[index]["content"])
        return index > last_user_index(messages) and (index == len(messages) - 1 or bool(reasoning))

    def _body(self, messages: Sequence[Message], index: int) -> str:
        message = messages[index]
        if message["role"] != "assistant":
            return super()._body(messages, index)
        reasoning, answer = split_thinking(message["content"])
        if not self._framed(messages, index):
            return answer + self.end_token
        return f"<think>\n{reasoning}\n</think>\n\n{answer}" + self.end_token


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking off (HF's template, ``enable_thinking=False``): the generation
    prompt ends with an empty ``<think>\\n\\n</think>\\n\\n`` block, so the model answers
    directly. In a supervised example that block is part of the produced turn's header,
    so it is never trained -- the model is always given it.

    >>> r = Qwen3DisableThinkingRenderer(tok)
    >>> text = tok.decode(r.build_generation_prompt([{"role": "user", "content": "Hi"}]).to_ints())
    >>> text.endswith("<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n")
    True
    """

    empty_block = "<think>\n\n</think>\n\n"

    def _produced(self, messages: Sequence[Message], index: int) -> bool:
        """The last message, an assistant one after the last user: the turn being produced."""
        produced = index == len(messages) - 1 and messages[index]["role"] == "assistant"
        return produced and index > last_user_index(messages)

    def _header(self, messages: Sequence[Message], index: int) -> str:
        header = super()._header(messages, index)
        return header + self.empty_block if self._produced(messages, index) else header

    def _body(self, messages: Sequence[Message], index: int) -> str:
        if not self._produced(messages, index):
            return super()._body(messages, index)
        reasoning, answer = split_thinking(messages[index]["content"])
        if reasoning:
            raise ValueError("qwen3_disable_thinking renders no reasoning on the produced turn; use 'qwen3'")
        return answer + self.end_token

    def _suffix(self, messages: Sequence[Message]) -> str:
        return super()._suffix(messages) + self.empty_block


RENDERER: dict[str, Callable[[Any], Renderer]] = {
    "role_colon": RoleColonRenderer,
    "llama3": Llama3Renderer,
    "qwen3": Qwen3Renderer,
    "qwen3_disable_thinking": Qwen3DisableThinkingRenderer,
    "chatml": ChatMLRenderer,
    "smollm2": lambda tokenizer: ChatMLRenderer(tokenizer, default_system=SMOLLM2_SYSTEM),
}
"""Renderer name -> factory taking a tokenizer. ``chatml`` renders the messages as given;
``smollm2`` is SmolLM2's built-in template (ChatML plus its default system prompt,
``SMOLLM2_SYSTEM``, when the conversation opens without a system message)."""


def get_renderer(name: str, tokenizer: Any) -> Renderer:
    """The renderer registered as ``name``, bound to ``tokenizer``.

    >>> get_renderer("qwen3", tok).get_stop_sequences()  # [151645], <|im_end|>
    >>> get_renderer("nope", tok)  # ValueError: unknown renderer 'nope'; known: chatml, ...
    """
    if name not in RENDERER:
        raise ValueError(f"unknown renderer {name!r}; known: {', '.join(sorted(RENDERER))}")
    return RENDERER[name](tokenizer)
