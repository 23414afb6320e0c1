"""Hostile requests to ``trinity-like serve``: what a web page, a careless script or a bad
datum sends, through the official SDK and as raw HTTP, against one real server process.

Each test breaks one thing and checks the whole contract: the request is refused at the
door with a one-line error naming the field (or the datum, key and position) and the
limit, nothing of it runs, the server goes on answering, and what a well-formed request
does is unchanged (compared with the in-process client on the same data). Each records
its row of the fault table (docs/reliability.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tinker
from _lib.faultlib import record
from _lib.serve_helpers import LOCAL_KEY, TEXTS, running_server, sft_data
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

import trinity_like.client as ours
from trinity_like.client.data import DataError
from trinity_like.models.tiny import build_tiny_model

os.environ["TINKER_API_KEY"] = LOCAL_KEY
MAX_DATUMS, MAX_SAMPLES = 4, 16  # the server's --max-batch-datums and --max-num-samples here
SERVED = "not needed (the server goes on)"
JSON = {"Content-Type": "application/json"}
PROTOBUF = "application/x-protobuf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("hostile-tiny") / "model", seed=7))


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny):
    """(base URL, data directory) of a keyless server on the tiny model (vocabulary 400, context 1024)."""
    data_dir = tmp_path_factory.mktemp("hostile") / "data"
    args = ("--model", tiny, "--max-batch-datums", str(MAX_DATUMS), "--max-num-samples", str(MAX_SAMPLES))
    args += ("--max-models", "32")  # this module's tests all make their clients here (the limit: serve/test_limits.py)
    with running_server(data_dir, *args) as url:
        yield url, data_dir


@pytest.fixture(scope="module")
def sdk(server):
    service = tinker.ServiceClient(base_url=server[0])
    yield service
    service.close("success").result()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with ours.ServiceClient(log_dir=tmp_path_factory.mktemp("hostile-local")) as service:
        yield service


def post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/{path}", content=json.dumps(body), headers=JSON if headers is None else headers, timeout=60
    )


def result(url: str, answer: httpx.Response, accept: str | None = None) -> httpx.Response:
    """The result of the request ``answer`` accepted, fetched as the SDK does (polling ``try_again``)."""
    assert answer.status_code == 200, answer.text
    headers = {**JSON, "Accept": accept} if accept else JSON
    for _ in range(100):
        got = post(url, "retrieve_future", {"request_id": answer.json()["request_id"]}, headers)
        if got.headers["content-type"] != "application/json" or got.json().get("type") != "try_again":
            return got
    raise AssertionError("no result after 100 polls")


def strict_json(text: str):
    """JSON as the standard has it: a bare NaN or Infinity is an error (Python's json reads them)."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON number {c} in an answer"))


def alive(url: str) -> None:
    assert httpx.get(f"{url}/api/v1/healthz", timeout=30).json() == {"status": "ok"}


def session(url: str) -> str:
    return post(url, "create_session", {"tags": [], "user_metadata": None, "sdk_version": "0"}).json()["session_id"]


def one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_a_web_page_cannot_drive_a_keyless_server(server, tiny, record_property):
    """What a page in the user's browser can send to 127.0.0.1 without a CORS preflight, and a
    DNS-rebinding page under its own name: refused before any route runs, nothing created."""
    url, _ = server
    port = url.rsplit(":", 1)[1]
    sid = session(url)
    create = {"session_id": sid, "model_seq_id": 0, "base_model": tiny, "lora_config": {"rank": 2}}
    runs = lambda: httpx.get(f"{url}/api/v1/training_runs").json()["cursor"]["total_count"]  # noqa: E731
    before = runs()
    evil = "http://evil.example"
    refused = {
        "cross-site text/plain (a form or fetch, no preflight)": ({"Content-Type": "text/plain", "Origin": evil}, 403),
        "cross-site form": ({"Content-Type": "application/x-www-form-urlencoded", "Origin": evil}, 403),
        "text/plain without Origin": ({"Content-Type": "text/plain"}, 415),
        "form without Origin": ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        "multipart": ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
        "no content type": ({}, 415),
        "JSON from a foreign origin": ({**JSON, "Origin": evil}, 403),
        "Origin null (a sandboxed frame, a file)": ({**JSON, "Origin": "null"}, 403),
        "another port of this machine": ({**JSON, "Origin": "http://localhost:3000"}, 403),
        "Sec-Fetch-Site cross-site": ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403),
        "Sec-Fetch-Site same-site": ({**JSON, "Sec-Fetch-Site": "same-site"}, 403),
        "DNS rebinding (Host evil.example)": ({**JSON, "Host": f"evil.example:{port}"}, 421),
        "Host of this machine on another port": ({**JSON, "Host": "127.0.0.1:1"}, 421),
        "Host without its port": ({**JSON, "Host": "localhost"}, 421),
    }
    for what, (headers, status) in refused.items():
        answer = post(url, "create_model", create, headers)
        assert answer.status_code == status, (what, answer.status_code, answer.text)
        one_line(answer.json()["error"])
    for what, headers in {
        "rebound GET": {"Host": f"evil.example:{port}"},
        "cross-site GET": {"Sec-Fetch-Site": "cross-site"},
    }.items():
        assert httpx.get(f"{url}/api/v1/training_runs", headers=headers).status_code in (403, 421), what
    assert runs() == before, "a refused request created a model"
    # the same request addressed as the SDK addresses it, under each of the server's own names
    for n, headers in enumerate(
        [JSON, {**JSON, "Host": f"localhost:{port}"}, {**JSON, "Host": f"[::1]:{port}"}, {**JSON, "Origin": url}]
    ):
        created = result(url, post(url, "create_model", {**create, "model_seq_id": 1 + n}, headers))
        assert created.json()["model_id"] == f"{sid}:train:{1 + n}", created.text
    assert runs() == before + 4
    record(
        record_property,
        "a web page drives a keyless `trinity-like serve`: 14 cross-site shapes (text/plain, form, multipart, foreign "
        "or null Origin, Sec-Fetch-Site, DNS-rebound or foreign Host)",
        "refused before any route: 403 / 415 / 421, one line each, no model created; the SDK's own requests served",
        SERVED,
        "-",
    )


def test_requests_without_seq_id_each_run_once(server, sdk, local, tiny, record_property):
    """optim_steps without a seq_id (raw HTTP) are each a step of their own, as the SDK's numbered
    ones are: the weights after equal the in-process client's after the same steps."""
    url, _ = server
    remote = sdk.create_lora_training_client(tiny, rank=4, seed=5).result()
    data = sft_data(remote.get_tokenizer(), TEXTS)
    adam = types.AdamParams(learning_rate=1e-2)
    ids = []
    for _ in range(2):
        remote.forward_backward(data, "cross_entropy").result()
        raw = post(url, "optim_step", {"model_id": remote.model_id, "optim_params": {"learning_rate": 1e-2}})
        ids.append(raw.json()["request_id"])
        assert strict_json(result(url, raw).text)["metrics"]["grad_norm"] > 0
    remote.forward_backward(data, "cross_entropy").result()
    remote.optim_step(adam).result()
    remote.forward_backward(data, "cross_entropy").result()
    remote.optim_step(adam).result()  # the SDK numbers each of its calls
    after = remote.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert ids[0] != ids[1]

    def in_process(steps: list[int]) -> float:
        """The loss after ``len(steps)`` optimiser steps, step i after ``steps[i]`` forward_backwards."""
        mine = local.create_lora_training_client(tiny, rank=4, seed=5)
        for passes in steps:
            for _ in range(passes):
                mine.forward_backward(data, "cross_entropy").result()
            mine.optim_step(adam).result()
        loss = mine.forward(data, "cross_entropy").result().metrics["loss:sum"]
        mine.close()
        return loss

    assert after == pytest.approx(in_process([1, 1, 1, 1]), rel=1e-5)
    assert after != pytest.approx(in_process([1, 2, 1]), rel=1e-5)  # what the second step dropped would give
    record(
        record_property,
        "optim_step requests without a seq_id (raw HTTP), beside the SDK's numbered ones",
        "each its own request id and result; every step applied: the weights of the same steps in-process",
        SERVED,
        "-",
    )


def test_sizes_beyond_the_limits_are_refused_with_the_field_and_the_limit(server, sdk, local, tiny, record_property):
    url, _ = server
    sid = session(url)
    sampler = sdk.create_sampling_client(base_model=tiny)
    ids = sampler.get_tokenizer().encode("one plus two")
    prompt = types.ModelInput.from_ints(ids)
    params = types.SamplingParams(max_tokens=4, seed=1)
    for call, match in [
        (lambda: sampler.sample(prompt, MAX_SAMPLES + 1, params), r"num_samples 17: must be between 1 and 16 "),
        (lambda: sampler.sample(prompt, 0, params), r"num_samples 0: must be between 1 and 16 \(--max-num-samples\)"),
        (
            lambda: sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1020)),
            rf"prompt \({len(ids)} tokens\) \+ max_tokens \(1020\) exceed the model's context of 1024",
        ),
        (
            lambda: sampler.sample(types.ModelInput.from_ints([5] * 1100), 1, params),
            r"prompt has 1100 tokens, more than the model's context of 1024",
        ),
        (lambda: sampler.sample(prompt, 1, types.SamplingParams()), r"sampling_params.max_tokens is required"),
    ]:
        with pytest.raises(tinker.BadRequestError, match=match) as err:
            call().result()
        one_line(str(err.value))
    # a 200-byte request asking for 200,000 samples
    raw = post(url, "create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": tiny})
    body = {"sampling_session_id": raw.json()["sampling_session_id"], "num_samples": 200_000}
    body |= {"prompt": prompt.model_dump(mode="json"), "sampling_params": {"max_tokens": 4}}
    answer = post(url, "asample", body)
    assert answer.status_code == 400 and "num_samples 200000: must be between 1 and 16" in answer.json()["error"]
    assert len(json.dumps(body)) < 300
    # forward_backward: more datums than the limit in one request, as raw protobuf
    remote = sdk.create_lora_training_client(tiny, rank=0, seed=1).result()
    data = sft_data(remote.get_tokenizer(), TEXTS * 4)  # 12 datums
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data[:5], loss_fn="cross_entropy"),
        model_id=remote.model_id,
    )
    answer = httpx.post(
        f"{url}/api/v1/forward_backward",
        content=forward_backward_request_to_proto(request).SerializeToString(),
        headers={"Content-Type": PROTOBUF},
    )
    assert answer.status_code == 400, answer.text
    assert "forward_backward of 5 datums: at most 4 per request (--max-batch-datums" in answer.json()["error"]
    # the SDK reads the limit from the server and splits a larger batch: the loss of the whole batch
    got = remote.forward(data, "cross_entropy").result()
    want = local.create_lora_training_client(tiny, rank=0, seed=1).forward(data, "cross_entropy").result()
    assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
    assert len(got.loss_fn_outputs) == len(data)
    alive(url)
    record(
        record_property,
        "sizes past the limits: num_samples 200,000 in a 200-byte request, max_tokens or a prompt past the "
        "context, 5 datums over --max-batch-datums 4",
        "HTTP 400 at the door naming the field and the limit (and the flag that raises it); the SDK splits a "
        "12-datum batch into requests under the limit, same loss as in-process",
        SERVED,
        "-",
    )


def bad_datum(tokens: list[int], **arrays) -> types.Datum:
    """A datum of ``tokens`` with next-token targets and unit weights, ``arrays`` changed (None: left out)."""
    inputs = {"target_tokens": tokens[1:] + [1], "weights": [1.0] * len(tokens)} | arrays
    inputs = {k: v for k, v in inputs.items() if v is not None}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def test_data_the_model_cannot_take_are_refused_in_both_doors(server, sdk, local, tiny, record_property):
    """NaN / inf values, ids outside the vocabulary, a datum past the context: one line naming
    the datum (and key and position) from the server's door and from the in-process client."""
    url, _ = server
    remote = sdk.create_lora_training_client(tiny, rank=2, seed=0).result()
    mine = local.create_lora_training_client(tiny, rank=2, seed=0)
    good = sft_data(remote.get_tokenizer(), TEXTS[:1])[0]
    rl = {"weights": None, "logprobs": [-1.0] * 3, "advantages": [1.0, float("nan"), 1.0]}
    cases = [
        ([good, bad_datum([1, 2, 3], weights=[1.0, 1.0, float("inf")])], "cross_entropy",
         r"datum 1: loss_fn_inputs\['weights'\] holds inf at position 2 \(every value must be finite\)"),
        ([bad_datum([1, 2, 3], **rl)], "importance_sampling",
         r"datum 0: loss_fn_inputs\['advantages'\] holds nan at position 1"),
        ([bad_datum([1, 2, 3], target_tokens=np.array([2.0, np.nan, 4.0], np.float32))], "cross_entropy",
         r"datum 0: loss_fn_inputs\['target_tokens'\] holds nan at position 1"),
        ([bad_datum([1, 2, 3], target_tokens=[2, 400, 4])], "cross_entropy",
         r"datum 0: loss_fn_inputs\['target_tokens'\]: token 400 is outside the model's vocabulary of 400 "
         r"\(ids 0\.\.399\), at position 1"),
        ([good, bad_datum([1, 2, 999, 4])], "cross_entropy",
         r"datum 1: model_input: token 999 is outside the model's vocabulary of 400 \(ids 0\.\.399\), at position 2"),
        ([bad_datum(list(range(1, 301)) * 7)], "cross_entropy",
         r"datum 0: model_input has 2100 tokens, more than the model's context of 1024 \(max_position_embeddings\)"),
    ]  # fmt: skip
    for data, loss, match in cases:
        with pytest.raises(tinker.BadRequestError, match=match) as err:  # the server: 400, nothing queued
            remote.forward_backward(data, loss).result()
        one_line(str(err.value))
        with pytest.raises(DataError, match=f"^{match}"):  # in-process: the same line from result()
            mine.forward_backward(data, loss).result()
    # nothing reached the engines: the next step has no gradient to apply, and its answer is fetched
    assert remote.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm"] == 0.0
    assert mine.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm"] == 0.0
    # a prompt outside the vocabulary
    sampler = remote.save_weights_and_get_sampling_client()
    with pytest.raises(tinker.BadRequestError, match=r"prompt: token 400 is outside .* at position 1"):
        sampler.sample(types.ModelInput.from_ints([1, 400]), 1, types.SamplingParams(max_tokens=2)).result()
    infinite = post(url, "optim_step", {"model_id": remote.model_id, "optim_params": {"learning_rate": "Infinity"}})
    assert infinite.status_code == 400 and "AdamParams.learning_rate must be finite, got inf" in infinite.text
    # weights that blow up (lr 1e30) make the loss and the gradient NaN: answered all the same,
    # NaN as the string "NaN" (strict JSON), which the SDK reads back as a float
    remote.forward_backward([good], "cross_entropy").result()
    remote.optim_step(types.AdamParams(learning_rate=1e30)).result()
    fwd = remote.forward_backward([good], "cross_entropy").result()
    raw = post(url, "optim_step", {"model_id": remote.model_id, "optim_params": {"learning_rate": 1e-3}})
    assert strict_json(result(url, raw).text)["metrics"]["grad_norm"] == "NaN"
    remote.forward_backward([good], "cross_entropy").result()
    step = remote.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert math.isnan(fwd.metrics["loss:sum"]) and math.isnan(step.metrics["grad_norm"])
    alive(url)
    mine.close()
    record(
        record_property,
        "data the model cannot take, to the server and the in-process client: NaN / inf in weights, advantages, "
        "targets; token ids outside the vocabulary (input, target, prompt); a 2,100-token datum on a 1,024 context",
        "refused before the engine: HTTP 400 / DataError from result(), one line naming datum, key, position and "
        'the limit; the next optim_step answers (no gradient); a NaN result travels as "NaN"',
        SERVED,
        "-",
    )


def test_results_are_answered_as_json_without_the_protobuf_accept_header(server, sdk, tiny, record_property):
    url, _ = server
    sid = session(url)
    sampler_id = post(
        url, "create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": tiny}
    ).json()["sampling_session_id"]
    body = {"sampling_session_id": sampler_id, "num_samples": 3, "seq_id": 1}
    body |= {"prompt": types.ModelInput.from_ints([5, 6, 7]).model_dump(mode="json")}
    body |= {"sampling_params": {"max_tokens": 6, "seed": 3}, "prompt_logprobs": True}
    answer = post(url, "asample", body)
    as_json = strict_json(result(url, answer).text)
    as_proto = deserialize_sample_response(result(url, answer, PROTOBUF).content)
    assert [s["tokens"] for s in as_json["sequences"]] == [s.tokens for s in as_proto.sequences]
    np.testing.assert_allclose(
        [s["logprobs"] for s in as_json["sequences"]], [s.logprobs for s in as_proto.sequences], rtol=1e-6
    )
    assert as_json["prompt_logprobs"][0] is None and len(as_json["prompt_logprobs"]) == 3
    remote = sdk.create_lora_training_client(tiny, rank=0, seed=1).result()
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=sft_data(remote.get_tokenizer(), TEXTS[:2]), loss_fn="cross_entropy"
        ),
        model_id=remote.model_id,
    )
    answer = httpx.post(
        f"{url}/api/v1/forward_backward",
        content=forward_backward_request_to_proto(request).SerializeToString(),
        headers={"Content-Type": PROTOBUF},
    )
    as_json = strict_json(result(url, answer).text)
    as_proto = deserialize_forward_backward_output(result(url, answer, PROTOBUF).content)
    assert as_json["metrics"]["loss:sum"] == pytest.approx(as_proto.metrics["loss:sum"], rel=1e-6)
    for got, want in zip(as_json["loss_fn_outputs"], as_proto.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(got["logprobs"]["data"], want["logprobs"].to_numpy(), rtol=1e-6)
    record(
        record_property,
        "retrieve_future of a sample / forward_backward result without the protobuf Accept header",
        "answered as JSON (tokens, logprobs, metrics equal to the protobuf answer's); no 500",
        SERVED,
        "-",
    )


def test_bad_names_and_data_dirs_are_user_errors_that_show_no_server_path(server, sdk, tiny, tmp_path, record_property):
    url, data_dir = server
    remote = sdk.create_lora_training_client(tiny, rank=2, seed=0).result()
    for call, match in [
        (lambda: remote.save_state(""), r"checkpoint name .* '' must be a plain name .*not empty"),
        (lambda: remote.save_state("x" * 300), r"checkpoint name .* of 300 characters: at most 128"),
        (lambda: remote.save_weights_for_sampler(""), r"'' must be a plain name"),
        (lambda: remote.load_state("tinker://nope:train:0/weights/w"), r"no such checkpoint on this server\"?\}?$"),
    ]:
        with pytest.raises(tinker.BadRequestError, match=match) as err:
            call().result()
        assert str(data_dir) not in str(err.value) and one_line(str(err.value))
    answer = post(url, "save_weights", {"model_id": remote.model_id, "seq_id": 100})
    assert answer.status_code == 400 and "checkpoint name (save_weights' path) is required" in answer.json()["error"]
    # a failure inside the server (its state folder made a file): reported, the data directory not shown
    (data_dir / "runs" / remote.model_id / "state").write_text("in the way")
    with pytest.raises(tinker.RequestFailedError) as err:
        remote.save_state("s1").result()
    assert "<data-dir>/runs/" in str(err.value) and str(data_dir) not in str(err.value), str(err.value)
    (data_dir / "runs" / remote.model_id / "state").unlink()
    assert remote.save_state("s1").result().path.endswith("/weights/s1")
    # the in-process client refuses the same names (from result())
    with ours.ServiceClient(log_dir=tmp_path / "local") as local:
        mine = local.create_lora_training_client(tiny, rank=2, seed=0)
        for name, match in [("", "must be a plain, non-empty file name"), ("y" * 300, "300 characters: at most 128")]:
            with pytest.raises(ValueError, match=match):
                mine.save_state(name).result()
    # a --data-dir that cannot be one: one line at start, exit 2
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad, match in [(afile, "a file is there, not a folder"), (tmp_path / ("d" * 300), "File name too long")]:
        out = subprocess.run(
            [sys.executable, "-m", "trinity_like.cli", "serve", "--port", "0", "--data-dir", str(bad)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("trinity-like: error: --data-dir ") and match in out.stderr
    alive(url)
    record(
        record_property,
        "bad checkpoint names (empty, 300 characters, missing) and a --data-dir that is a file or a 300-character "
        "name; an OS error inside a save",
        "names: HTTP 400 (user), one line, in both doors; --data-dir: one line at start, exit 2; no message shows "
        "the server's data directory (<data-dir>)",
        SERVED,
        "-",
    )
