"""A server's memory is bounded: at most ``--max-models`` training clients, and the
``--max-samplers`` most recently used sampling sessions (an RL loop makes a snapshot sampler,
a copy of the weights, every step)."""

from __future__ import annotations

import pytest
from tinker import types

from trinity_like.client.serve.backend import Backend, NotFound
from trinity_like.client.serve.config import ServeParams
from trinity_like.errors import ConfigError


@pytest.fixture
def backend(tmp_path):
    made = Backend(ServeParams(data_dir=tmp_path / "data", max_models=2, max_samplers=2))
    yield made
    made.close()


def new_model(backend: Backend, session: str, seq: int, base: str) -> str:
    request = types.CreateModelRequest(session_id=session, model_seq_id=seq, base_model=base)
    fut = backend.future(backend.create_model(request).request_id)
    return fut.result(timeout=120).model_id


def test_one_model_past_max_models_is_refused_naming_the_flag_and_a_retry_still_answers(backend, tiny_model):
    session = backend.create_session()
    first, second = (new_model(backend, session, seq, tiny_model) for seq in (0, 1))
    with pytest.raises(ValueError, match=r"holds 2 training models, its limit \(--max-models 2\)"):
        new_model(backend, session, 2, tiny_model)
    # the SDK resending model 1's request after a lost answer gets its first answer, not a refusal
    assert new_model(backend, session, 1, tiny_model) == second
    assert backend.training(first).base_model == tiny_model


def test_the_least_recently_used_sampler_is_let_go_and_says_so(backend, tiny_model):
    session = backend.create_session()

    def sampler(seq: int) -> str:
        request = types.CreateSamplingSessionRequest(
            session_id=session, sampling_session_seq_id=seq, base_model=tiny_model
        )
        return backend.create_sampler(request)

    a, b = sampler(0), sampler(1)
    backend.sampler(a)  # used: b is now the least recent
    c = sampler(2)
    assert backend.sampler(a) and backend.sampler(c)
    with pytest.raises(NotFound, match=r"was let go: this server keeps the 2 most recently used \(--max-samplers\)"):
        backend.sampler(b)
    with pytest.raises(NotFound, match="unknown sampling session"):
        backend.sampler(f"{session}:sample:9")


def test_snapshot_samplers_of_a_training_loop_stay_bounded(backend, tiny_model):
    session = backend.create_session()
    model = new_model(backend, session, 0, tiny_model)
    ids = []
    for step in range(4):  # the cookbook's loop: save_weights_and_get_sampling_client every step
        request = types.SaveWeightsForSamplerRequest(model_id=model, sampling_session_seq_id=step, seq_id=100 + step)
        ids.append(backend.future(backend.save_for_sampler(request).request_id).result(timeout=120).sampling_session_id)
    assert len(backend._samplers) == 2 and list(backend._samplers) == ids[-2:]
    with pytest.raises(NotFound, match="was let go"):
        backend.sampler(ids[0])


@pytest.mark.parametrize("field,flag", [("max_models", "--max-models"), ("max_samplers", "--max-samplers")])
def test_a_limit_below_one_is_refused_at_start(tmp_path, field, flag):
    with pytest.raises(ConfigError, match=f"{flag} must be >= 1, got 0"):
        ServeParams(data_dir=tmp_path, **{field: 0}).check()
