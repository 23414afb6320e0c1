"""Appending chat messages to a token history without re-tokenising it.

A multi-turn chat env must add, after the policy's action, the tokens of the next
messages (a tool result, the other player's words) and of the opening of the next
assistant turn -- exactly the tokens the chat template would write there. Rendering the
whole conversation again and tokenising it would not do: the same text may tokenise
differently from the tokens that were sampled (the "tokenisation drift" of multi-turn
RL). So only the *new* text is tokenised, and it is appended to the history as is.

The new text is found from the tokenizer's own chat template: the conversation is
rendered with a placeholder as the last assistant message, followed by the new messages
and the generation prompt; everything after the placeholder is what follows an
assistant turn. When the action already ended with the special token that closes the
turn (``<|im_end|>``), that token's text is not written twice.

Example (a ChatML template)::

    delta = message_tokens(tok, history_messages, [{"role": "user", "content": "579"}],
                           action_tokens=[..., im_end])
    tok.decode(delta)   # '\\n<|im_start|>user\\n579<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trinity_like.errors import TrinityError

Message = dict[str, str]
_PLACEHOLDER = "TRINITYLIKEACTIONPLACEHOLDER"


def message_tokens(
    tokenizer: Any, messages: Sequence[Message], new_messages: Sequence[Message], *, action_tokens: Sequence[int]
) -> list[int]:
    """Token ids to append after an assistant action to add ``new_messages`` and open the next
    assistant turn, under ``tokenizer``'s chat template.

    ``messages`` is the conversation before the action (the template may depend on it: a
    default system prompt, a tool-call grouping); the action itself is the assistant turn
    that follows them.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrinityError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
    if not new_messages:
        raise TrinityError("message_tokens: no new messages to append")
    turn = [*messages, {"role": "assistant", "content": _PLACEHOLDER}]
    text = tokenizer.apply_chat_template([*turn, *new_messages], tokenize=False, add_generation_prompt=True)
    if text.count(_PLACEHOLDER) != 1:
        raise TrinityError("message_tokens: the chat template does not write an assistant message's content verbatim")
    delta = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
    if action_tokens and int(action_tokens[-1]) in set(tokenizer.all_special_ids):
        closing = tokenizer.decode([int(action_tokens[-1])])
        if delta.startswith(closing):  # the action stopped at the end-of-turn token: it is there already
            delta = delta[len(closing) :]
    return list(tokenizer.encode(delta, add_special_tokens=False))
