"""The Bradley-Terry reward model folder: the contract between the RM trainer and the scorer.

A reward model is a causal-LM backbone with a scalar head read at the last non-pad token
(Ouyang et al. 2022; Bradley & Terry 1952 for the pairwise loss that trains it). Its
folder is a normal Hugging Face causal-LM folder (config, safetensors, tokenizer) plus::

    reward_head.safetensors   {"weight": [1, hidden], "bias": [1]}

so the backbone loads with any tool, and the head is one small extra file. The RM trainer
writes it with :func:`save_reward_model`; the ``reward_model`` reward function reads it
with :func:`load_reward_model` and scores with :func:`score_conversations`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from trinity_like.errors import TrinityError

HEAD_FILE = "reward_head.safetensors"


class RewardModel(torch.nn.Module):
    """A causal LM's final hidden state at the last real token, through a linear head."""

    def __init__(self, backbone: PreTrainedModel, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head if head is not None else torch.nn.Linear(backbone.config.hidden_size, 1)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Scores [B]; works with left or right padding (the last 1 of the mask is read)."""
        hidden_BTH = self.backbone.base_model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).last_hidden_state
        positions_T = torch.arange(attention_mask_BT.shape[1], device=attention_mask_BT.device)
        last_B = (attention_mask_BT.long() * (positions_T + 1)).argmax(dim=1)
        last_BH = hidden_BTH[torch.arange(hidden_BTH.shape[0]), last_B]
        return self.head(last_BH.to(self.head.weight.dtype)).squeeze(-1)


def save_reward_model(model: RewardModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` as a reward-model folder (backbone + tokenizer + head file)."""
    path = Path(path)
    model.backbone.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    head = {"weight": model.head.weight.detach().cpu().contiguous(), "bias": model.head.bias.detach().cpu().contiguous()}
    save_file(head, str(path / HEAD_FILE))
    return path


def load_reward_model(path: str | os.PathLike[str]) -> tuple[RewardModel, PreTrainedTokenizerBase]:
    """Load a folder written by :func:`save_reward_model`, in eval mode."""
    path = Path(path).expanduser()
    if not (path / HEAD_FILE).is_file():
        raise TrinityError(f"reward model {str(path)!r}: no {HEAD_FILE} (not a folder written by save_reward_model)")
    backbone = AutoModelForCausalLM.from_pretrained(path)
    tensors = load_file(str(path / HEAD_FILE))
    head = torch.nn.Linear(tensors["weight"].shape[1], 1)
    head.load_state_dict(tensors)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return RewardModel(backbone, head).eval(), tokenizer


def score_conversations(
    model: RewardModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Sequence[dict[str, str]]],
    max_length: int,
) -> list[float]:
    """Scores of whole conversations rendered with the chat template (the last ``max_length`` tokens)."""
    rows = []
    for conv in conversations:
        text = tokenizer.apply_chat_template(list(conv), tokenize=False)
        rows.append(tokenizer.encode(text, add_special_tokens=False)[-max_length:])
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids_BT = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask_BT = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.inference_mode():
        return model(ids_BT, mask_BT).tolist()
