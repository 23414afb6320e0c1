"""Chat rows to training tokens: supervise assistant turns only, whatever the template does.

Why not tokenize each message and concatenate: a chat template decides how a turn looks,
and it may render the same assistant message differently depending on where it stands
(Qwen3 adds an empty ``<think>\\n\\n</think>`` block to assistant turns after the last user
message, and strips reasoning from earlier ones). So we render the whole conversation
once, tokenize that text -- exactly what the model sees -- and find each assistant turn
in it by rendering prefixes: the text ``template(messages[:i], add_generation_prompt=True)``
is what the model reads before it writes turn ``i``, so turn ``i`` starts where that text
ends, and it ends with the template's end-of-turn token (included: the model must learn to
stop). Tokens are marked by their character offsets, so system, user and tool turns, the
turn headers and anything after the last assistant turn are never supervised.

Example::

    tokens, prompt_length, mask = tokenize_chat(tok, [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
    tok.decode([t for t, m in zip(tokens[prompt_length:], mask) if m])   # '4<|im_end|>'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]


def render(
    tokenizer: Any, messages: Sequence[Message], *, generation_prompt: bool, template_kwargs: Mapping[str, Any]
) -> str:
    """The chat template's text for ``messages``."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt, **template_kwargs
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected text")
    return text


def end_of_turn(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The special token that closes an assistant turn (``<|im_end|>`` in ChatML), or ``""``.

    Found by rendering a probe conversation and reading the special token that follows
    the assistant's text, so it works for any template that closes turns with one.
    """
    sentinel = "SENTINEL-7f3a"
    probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}]
    text = render(tokenizer, probe, generation_prompt=False, template_kwargs=template_kwargs or {})
    tail = text[text.rfind(sentinel) + len(sentinel) :].lstrip()
    specials = sorted(tokenizer.all_special_tokens, key=len, reverse=True)
    return next((s for s in specials if tail.startswith(s)), "")


def end_of_turn_id(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> int:
    """Token id appended to a bare response: the end-of-turn token, else the eos token."""
    eot = end_of_turn(tokenizer, template_kwargs)
    if eot:
        return tokenizer.convert_tokens_to_ids(eot)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has neither an end-of-turn token nor an eos token")
    return tokenizer.eos_token_id


def assistant_spans(
    tokenizer: Any, messages: Sequence[Message], full: str, *, template_kwargs: Mapping[str, Any], eot: str
) -> list[tuple[int, int]]:
    """Character spans of the assistant turns inside ``full`` (the whole conversation rendered)."""
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(tokenizer, messages[:i], generation_prompt=True, template_kwargs=template_kwargs)
        if full.startswith(prefix) and len(prefix) >= cursor:
            start = len(prefix)
        else:  # the template renders earlier turns differently here: find the text itself
            start = full.find(str(message["content"]).strip(), cursor)
            if start < 0:
                raise ValueError(f"assistant message {i} is not found in the rendered conversation")
        end = full.find(eot, start) + len(eot) if eot else -1
        if not eot or end < len(eot):
            content = str(message["content"]).strip()
            end = full.find(content, start) + len(content)
        spans.append((start, end))
        cursor = end
    return spans


def tokenize_chat(
    tokenizer: Any, messages: Sequence[Message], *, template_kwargs: Mapping[str, Any] | None = None
) -> tuple[list[int], int, list[int]]:
    """``(tokens, prompt_length, action_mask)`` of a conversation; the mask marks assistant tokens.

    ``prompt_length`` is the number of tokens before the first assistant turn; tokens after
    the last assistant turn are dropped (nothing there is trained on). A conversation
    without an assistant message is a ``ValueError``.
    """
    kwargs = dict(template_kwargs or {})
    full = render(tokenizer, messages, generation_prompt=False, template_kwargs=kwargs)
    spans = assistant_spans(tokenizer, messages, full, template_kwargs=kwargs, eot=end_of_turn(tokenizer, kwargs))
    if not spans:
        raise ValueError("the conversation has no assistant message to train on")
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [int(any(s <= a and b <= e and a < b for s, e in spans)) for a, b in offsets]
    if not any(mask):
        raise ValueError("the assistant turns are empty after tokenization")
    first = mask.index(1)
    last = len(mask) - 1 - mask[::-1].index(1)
    return ids[: last + 1], first, mask[first : last + 1]


def tokenize_prompt(
    tokenizer: Any, messages: Sequence[Message], *, template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """Tokens of a prompt as the model sees it before answering (generation prompt included)."""
    text = render(tokenizer, messages, generation_prompt=True, template_kwargs=dict(template_kwargs or {}))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_response(tokenizer: Any, text: str, end_id: int) -> list[int]:
    """Tokens of a bare response followed by the end-of-turn token."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [end_id]
