"""Behind ``trinity-like serve``: a sampler whose engine does not hold the weights it was given
refuses to sample (the server's first weight update is dropped on the engine's load path,
``TRINITY_LIKE_WEIGHT_FAULT=drop:1``), and the SDK gets the error naming both digests."""

from __future__ import annotations

import pytest
import tinker
from _lib.serve_helpers import TEXTS, running_server, sft_data
from tinker import types

from trinity_like.fault_points import WEIGHT_ENV_VAR


def test_a_dropped_update_behind_serve_is_refused(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv(WEIGHT_ENV_VAR, "drop:1")  # the server process inherits it
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with running_server(data_dir, "--model", tiny_model) as url:
        service = tinker.ServiceClient(base_url=url)
        try:
            training = service.create_lora_training_client(base_model=tiny_model, rank=4)
            training = training.result() if hasattr(training, "result") else training
            tok = training.get_tokenizer()
            training.forward_backward(sft_data(tok, TEXTS), "cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            sampler = training.save_weights_and_get_sampling_client().result()
            prompt = types.ModelInput.from_ints(tok.encode("one plus two"))
            with pytest.raises(Exception, match=r"the engine holds digest \w+, expected \w+"):
                sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, seed=0)).result()
        finally:
            service.close("success").result()
