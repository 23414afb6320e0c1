"""Chat messages -> token ids, and which of them are the assistant's: the one place that does it.

Every user of a chat template goes through here: the explorer's prompts and the envs'
opening observations (:func:`render_prompt`), an env's tokens for messages appended after
an action (:func:`message_tokens`), SFT rows with assistant-only supervision
(:func:`tokenize_chat`), preference pairs (:func:`render_prompt` + :func:`tokenize_response`),
and the client's renderers, which write their own format strings and encode them with
:func:`encode_text`. Two rules hold everywhere:

- A template's text is encoded with no special tokens added (:func:`encode_text`): templates
  already contain every special token they need, and a second BOS would shift the model.
- Tokens already sampled are never re-tokenised: a multi-turn history grows by appending
  the tokens of the *new* text only (:func:`message_tokens`), because the same text may
  tokenise differently from what was sampled (the "tokenisation drift" of multi-turn RL).

Why :func:`tokenize_chat` does not tokenize each message and concatenate: a chat template
decides how a turn looks, and it may render the same assistant message differently
depending on where it stands (Qwen3 adds an empty ``<think>\\n\\n</think>`` block to
assistant turns after the last user message, and strips reasoning from earlier ones). So
the whole conversation is rendered once and tokenized -- exactly what the model sees -- and
each assistant turn is found in it by rendering prefixes: the text
``template(messages[:i], add_generation_prompt=True)`` is what the model reads before it
writes turn ``i``, so turn ``i`` starts where that text ends, and it ends with the
template's end-of-turn token (included: the model must learn to stop). Tokens are marked by
their character offsets, so system, user and tool turns, the turn headers and anything
after the last assistant turn are never supervised.

Example::

    prompt = render_prompt(tok, [{"role": "user", "content": "What is 2 + 3?"}])
    tokens, prompt_length, mask = tokenize_chat(tok, [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
    tok.decode([t for t, m in zip(tokens[prompt_length:], mask) if m])   # '4<|im_end|>'
    delta = message_tokens(tok, history_messages, [{"role": "user", "content": "579"}],
                           action_tokens=[..., im_end])
    tok.decode(delta)   # '\\n<|im_start|>user\\n579<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trinity_like.errors import TrinityError

Message = Mapping[str, Any]
"""A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``."""

_PLACEHOLDER = "TRINITYLIKEACTIONPLACEHOLDER"


# -- the primitives ---------------------------------------------------------------------------------
def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids, special tokens written in it included, with no BOS/EOS added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def encode_pieces(tokenizer: Any, pieces: Sequence[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """Text pieces encoded one by one and concatenated, each token flagged as its piece is.

    A format that writes its own framing (the client's renderers) marks what is trained
    this way: each piece ends on a token boundary, so the flags are exact, where encoding
    the joined text might merge a header's last characters with a body's first.

    Example::

        ids, trained = encode_pieces(tok, [("<|im_start|>user\\n", False), ("Hi<|im_end|>", True)])
        # trained: False on the header's tokens, True on those of 'Hi' and '<|im_end|>'
    """
    ids: list[int] = []
    flags: list[bool] = []
    for text, flag in pieces:
        piece = encode_text(tokenizer, text)
        ids += piece
        flags += [flag] * len(piece)
    return ids, flags


def single_token_id(tokenizer: Any, text: str) -> int:
    """The id of a special token written as ``text``; a ``ValueError`` unless it is exactly one token."""
    ids = encode_text(tokenizer, text)
    if len(ids) != 1:
        raise ValueError(f"{text!r} must be one token of {getattr(tokenizer, 'name_or_path', '?')!r}, got {ids}")
    return ids[0]


def render_text(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The tokenizer's chat template applied to ``messages``, as text."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrinityError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **dict(template_kwargs or {}),
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected text")
    return text


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, ending where the assistant
    speaks (with ``add_generation_prompt``, the default)."""
    text = render_text(
        tokenizer, messages, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs
    )
    return encode_text(tokenizer, text)


# -- end of turn ------------------------------------------------------------------------------------
def end_of_turn(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The special token that closes an assistant turn (``<|im_end|>`` in ChatML), or ``""``.

    Found by rendering a probe conversation and reading the special token that follows
    the assistant's text, so it works for any template that closes turns with one.
    """
    sentinel = "SENTINEL-7f3a"
    probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}]
    text = render_text(tokenizer, probe, add_generation_prompt=False, template_kwargs=template_kwargs)
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


def tokenize_response(tokenizer: Any, text: str, end_id: int) -> list[int]:
    """Tokens of a bare response followed by the end-of-turn token (a preference pair's side)."""
    return encode_text(tokenizer, text) + [end_id]


# -- a whole conversation, assistant turns marked ----------------------------------------------------
def _assistant_spans(
    tokenizer: Any, messages: Sequence[Message], full: str, *, template_kwargs: Mapping[str, Any], eot: str
) -> list[tuple[int, int]]:
    """Character spans of the assistant turns inside ``full`` (the whole conversation rendered)."""
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render_text(tokenizer, messages[:i], add_generation_prompt=True, template_kwargs=template_kwargs)
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
    full = render_text(tokenizer, messages, add_generation_prompt=False, template_kwargs=kwargs)
    spans = _assistant_spans(tokenizer, messages, full, template_kwargs=kwargs, eot=end_of_turn(tokenizer, kwargs))
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


# -- a history that grows without re-tokenising ------------------------------------------------------
def message_tokens(
    tokenizer: Any, messages: Sequence[Message], new_messages: Sequence[Message], *, action_tokens: Sequence[int]
) -> list[int]:
    """Token ids to append after an assistant action to add ``new_messages`` and open the next
    assistant turn, under ``tokenizer``'s chat template.

    ``messages`` is the conversation before the action (the template may depend on it: a
    default system prompt, a tool-call grouping); the action itself is the assistant turn
    that follows them. The new text is found from the template itself: the conversation is
    rendered with a placeholder as the action's content, followed by the new messages and
    the generation prompt; everything after the placeholder is what follows an assistant
    turn. When the action already ended with the special token that closes the turn
    (``<|im_end|>``), that token's text is not written twice.
    """
    if not new_messages:
        raise TrinityError("message_tokens: no new messages to append")
    turn = [*messages, {"role": "assistant", "content": _PLACEHOLDER}]
    text = render_text(tokenizer, [*turn, *new_messages], add_generation_prompt=True)
    if text.count(_PLACEHOLDER) != 1:
        raise TrinityError("message_tokens: the chat template does not write an assistant message's content verbatim")
    delta = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
    if action_tokens and int(action_tokens[-1]) in set(tokenizer.all_special_ids):
        closing = tokenizer.decode([int(action_tokens[-1])])
        if delta.startswith(closing):  # the action stopped at the end-of-turn token: it is there already
            delta = delta[len(closing) :]
    return encode_text(tokenizer, delta)
