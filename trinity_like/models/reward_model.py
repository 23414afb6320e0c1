"""The Bradley-Terry reward model folder: the contract between the RM trainer and the scorer.

A reward model is a causal-LM backbone with a scalar head read at the last non-pad token
(Ouyang et al. 2022; Bradley & Terry 1952 for the pairwise loss that trains it). Its
folder is a normal Hugging Face causal-LM folder (config, safetensors, tokenizer) plus::

    reward_head.safetensors   {"weight": [1, hidden], "bias": [1]}

so the backbone loads with any tool, and the head is one small extra file.

The ``rm`` algorithm's train engines save the other common layout: a one-label
``*ForTokenClassification`` folder (verl's critic architecture), read at the same last
real token. :func:`load_reward_model` reads both, and also takes a run directory
(``runs/rm``), where it picks the model of the latest checkpoint.

Scoring renders a (prompt, response) exactly as the RM trainer saw its pairs: the prompt
through the chat template with the generation prompt, then the response and the
end-of-turn token (:mod:`trinity_like.models.chat`), so train and score sequences match.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from trinity_like.errors import TrinityError
from trinity_like.models.device import resolve_device

HEAD_FILE = "reward_head.safetensors"


class RewardModel(torch.nn.Module):
    """A causal LM's final hidden state at the last real token, through a linear head."""

    def __init__(self, backbone: PreTrainedModel, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head if head is not None else torch.nn.Linear(backbone.config.hidden_size, 1)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Scores [B]; works with left or right padding (the last 1 of the mask is read)."""
        hidden_BTH = self.backbone.base_model(
            input_ids=input_ids_BT, attention_mask=attention_mask_BT
        ).last_hidden_state
        positions_T = torch.arange(attention_mask_BT.shape[1], device=attention_mask_BT.device)
        last_B = (attention_mask_BT.long() * (positions_T + 1)).argmax(dim=1)
        last_BH = hidden_BTH[torch.arange(hidden_BTH.shape[0]), last_B]
        return self.head(last_BH.to(self.head.weight.dtype)).squeeze(-1)


def save_reward_model(model: RewardModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` as a reward-model folder (backbone + tokenizer + head file)."""
    path = Path(path)
    model.backbone.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    head = {
        "weight": model.head.weight.detach().cpu().contiguous(),
        "bias": model.head.bias.detach().cpu().contiguous(),
    }
    save_file(head, str(path / HEAD_FILE))
    return path


class TokenClassifierRewardModel(torch.nn.Module):
    """A one-label ``*ForTokenClassification`` model read at the last real token."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        logits_BT1 = self.model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits
        positions_T = torch.arange(attention_mask_BT.shape[1], device=attention_mask_BT.device)
        last_B = (attention_mask_BT.long() * (positions_T + 1)).argmax(dim=1)
        return logits_BT1[torch.arange(logits_BT1.shape[0]), last_B, 0].float()


def _model_folder(path: Path) -> Path:
    """``path`` itself, or the model of the latest checkpoint when ``path`` is a run directory."""
    pointer = path / "checkpoints" / "latest"
    if pointer.is_file():
        return path / "checkpoints" / pointer.read_text().strip() / "model"
    return path


def load_reward_model(
    path: str | os.PathLike[str], device: str | None = None
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a reward model folder (either layout) or a run directory's latest one, in eval mode, on
    ``device`` (None: the run's device, :func:`~trinity_like.models.device.run_device`), in float32."""
    model, tokenizer = _load_reward_model(_model_folder(Path(path).expanduser()))
    return model.to(resolve_device(device)), tokenizer


def _load_reward_model(path: Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    if not (path / "config.json").is_file():
        raise TrinityError(
            f"reward model {str(path)!r}: no config.json (expected a reward-model folder or an rm run directory)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if (path / HEAD_FILE).is_file():
        backbone = AutoModelForCausalLM.from_pretrained(path)
        tensors = load_file(str(path / HEAD_FILE))
        head = torch.nn.Linear(tensors["weight"].shape[1], 1)
        head.load_state_dict(tensors)
        return RewardModel(backbone, head).eval(), tokenizer
    config = AutoConfig.from_pretrained(path)
    if not any(a.endswith("ForTokenClassification") for a in (config.architectures or [])) or config.num_labels != 1:
        raise TrinityError(
            f"reward model {str(path)!r}: neither a {HEAD_FILE} nor a one-label *ForTokenClassification model"
        )
    model = AutoModelForTokenClassification.from_pretrained(path)
    return TokenClassifierRewardModel(model).eval(), tokenizer


def score_conversations(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Sequence[dict[str, str]]],
    max_length: int,
) -> list[float]:
    """Scores of conversations whose last message is the assistant's response (last ``max_length`` tokens kept)."""
    from trinity_like.models.chat import end_of_turn_id, render_prompt, tokenize_response

    end_id = end_of_turn_id(tokenizer)
    rows = []
    for conv in conversations:
        *prompt, last = list(conv)
        if last.get("role") != "assistant":
            raise TrinityError("score_conversations: the last message must be the assistant's response")
        tokens = render_prompt(tokenizer, prompt) + tokenize_response(tokenizer, last["content"], end_id)
        rows.append(tokens[-max_length:])
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device
    ids_BT = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
    mask_BT = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
    with torch.inference_mode():
        return model(ids_BT, mask_BT).tolist()
