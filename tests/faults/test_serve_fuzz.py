"""Every route of ``trinity-like serve`` fuzzed: schemathesis generates requests from the
server's own OpenAPI document (the SDK's ``tinker.types`` models), valid and invalid, and
hypothesis builds ``forward_backward`` protobuf bodies of arbitrary data. Half the
generated requests name the live session, model and sampler, so they reach the engines
rather than stopping at "unknown id". Contract: no answer is a 5xx, every answer is JSON
with one line of error (or the result), and after every case a normal request is still
served. Bounded: a fixed number of cases per route, derandomised (the same cases each run).
"""

from __future__ import annotations

import json
import math
import os

import httpx
import pytest
import schemathesis
from _lib.faultlib import record
from _lib.serve_helpers import LOCAL_KEY, running_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from trinity_like.client.serve.app import BODIES, json_safe
from trinity_like.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow
os.environ["TINKER_API_KEY"] = LOCAL_KEY
CASES_PER_ROUTE = 12  # per route and generation mode (valid, invalid)
FUZZ = settings(
    max_examples=CASES_PER_ROUTE,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
JSON = {"Content-Type": "application/json"}
schemathesis.serializer.alias("application/x-protobuf", "application/octet-stream")  # bytes as they are


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A server on the tiny model (vocabulary 400, context 1024) with a session, a model and a
    sampler in it: (base URL, the ids a request may name)."""
    tiny = str(build_tiny_model(tmp_path_factory.mktemp("fuzz-tiny") / "model", seed=3))
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    with running_server(data_dir, "--model", tiny, "--max-num-samples", "4", "--poll-seconds", "1") as url:
        post = lambda path, body: httpx.post(f"{url}/api/v1/{path}", json=body, timeout=60).json()  # noqa: E731
        session = post("create_session", {"tags": [], "user_metadata": None, "sdk_version": "0"})["session_id"]
        model = post("create_model", {"session_id": session, "model_seq_id": 0, "base_model": tiny})
        for _ in range(60):  # created in the background
            if post("retrieve_future", {"request_id": model["request_id"]}).get("type") != "try_again":
                break
        sampler = post(
            "create_sampling_session", {"session_id": session, "sampling_session_seq_id": 0, "base_model": tiny}
        )
        ids = {
            "session_id": session,
            "model_id": model["model_id"],
            "sampling_session_id": sampler["sampling_session_id"],
            "sampler_id": sampler["sampling_session_id"],
            "request_id": model["request_id"],
            "run": model["model_id"],
            "base_model": tiny,
        }
        yield url, ids


def still_serving(url: str, ids: dict[str, str]) -> None:
    """A normal request after a hostile one: the health check and the live model's info."""
    assert httpx.get(f"{url}/api/v1/healthz", timeout=60).status_code == 200
    info = httpx.post(f"{url}/api/v1/get_info", json={"model_id": ids["model_id"]}, timeout=60)
    assert info.status_code == 200 and info.json()["model_id"] == ids["model_id"], info.text


def check_answer(response: httpx.Response | schemathesis.Response, what: str) -> None:
    status = response.status_code
    assert status < 500, f"{status} for {what}: {response.text[:500]}"
    content_type = response.headers.get("content-type", "")  # schemathesis: a list of values
    if "application/json" in (content_type if isinstance(content_type, str) else " ".join(content_type)):
        body = json.loads(response.text, parse_constant=lambda c: pytest.fail(f"non-JSON number {c}: {what}"))
        if status >= 400 and isinstance(body, dict) and "error" in body:
            assert "\n" not in body["error"] and "Traceback" not in body["error"], body["error"]


def name_live_ids(case, ids: dict[str, str]) -> None:
    """Point the ids of ``case`` (every id field of its route's request model, path parameters) at
    the live session, model and sampler."""
    model = BODIES.get(case.operation.path)
    if isinstance(case.body, dict) and isinstance(model, type):
        for key in model.model_fields.keys() & ids.keys():
            case.body[key] = ids[key]
    for key in (case.path_parameters or {}).keys() & ids.keys():
        case.path_parameters[key] = ids[key]


def test_every_route_fuzzed_from_the_openapi_document(live, record_property):
    url, ids = live
    schema = schemathesis.openapi.from_url(f"{url}/api/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    sent = {"count": 0}
    for op in operations:
        mutable = bool(list(op.body) or list(op.iter_parameters()))  # else nothing can be made invalid
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if mutable else (GenerationMode.POSITIVE,):

            @FUZZ
            @given(case=op.as_strategy(generation_mode=mode), use_live=st.booleans())
            def fuzz(case, use_live):
                if use_live:
                    name_live_ids(case, ids)
                response = case.call(base_url=url, timeout=120)
                check_answer(response, case.as_curl_command())
                sent["count"] += 1
                still_serving(url, ids)

            try:
                fuzz()
            except Unsatisfiable:  # nothing of it can be invalid: any string is a path parameter, any bytes a body
                assert mode == GenerationMode.NEGATIVE, op.label
    record(
        record_property,
        f"schemathesis over every route of `trinity-like serve` ({len(operations)} routes, {sent['count']} "
        "generated requests, valid and invalid, half naming the live model and sampler)",
        "no 5xx; every error one line of JSON; a normal request served after each",
        "not needed (the server stayed up)",
        "-",
    )


# forward_backward data as the SDK sends it (protobuf): a datum is well formed for the tiny model,
# or has one thing broken -- an id of the whole int32 range, a NaN / inf / huge float, an array one
# longer or shorter than its tokens, no tokens; losses known and not, configs of any float.
FLOAT_KEYS = ("weights", "advantages", "logprobs")
BREAKS = (None, None, "token", "target", "value", "length", "empty")
LOSS = st.sampled_from(["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "no_such_loss"])
CONFIG = st.dictionaries(st.sampled_from(["clip_low_threshold", "clip_high_threshold", "beta", "nope"]), st.floats())


@st.composite
def datums(draw) -> dict:
    n = draw(st.integers(1, 24))
    vocab = st.lists(st.integers(0, 399), min_size=n, max_size=n)
    d = {"tokens": draw(vocab), "targets": draw(vocab)}
    for key in FLOAT_KEYS:
        d[key] = draw(st.lists(st.floats(-5, 5, width=32), min_size=n, max_size=n))
    broken, i = draw(st.sampled_from(BREAKS)), draw(st.integers(0, n - 1))
    if broken in ("token", "target"):
        d["tokens" if broken == "token" else "targets"][i] = draw(st.integers(-(2**31), 2**31 - 1))
    elif broken == "value":
        d[draw(st.sampled_from(FLOAT_KEYS))][i] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 3e38]))
    elif broken == "length":
        key = draw(st.sampled_from(("targets", *FLOAT_KEYS)))
        d[key] = d[key][:-1] if draw(st.booleans()) else [*d[key], d[key][0]]
    elif broken == "empty":
        d["tokens"] = []
    return d


def protobuf_body(model_id: str, data: list[dict], loss: str, config: dict, forward_only: bool) -> bytes:
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints(d["tokens"]),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=d["targets"], dtype="int64", shape=[len(d["targets"])]),
                **{k: types.TensorData(data=d[k], dtype="float32", shape=[len(d[k])]) for k in FLOAT_KEYS},
            },
        )
        for d in data
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn=loss, loss_fn_config=config or None),
        model_id=model_id,
    )
    message = forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    return message.SerializeToString()


def test_forward_backward_fuzzed_with_arbitrary_data(live, record_property):
    url, ids = live
    sent = {"count": 0, "accepted": 0}

    @settings(FUZZ, max_examples=4 * CASES_PER_ROUTE)
    @given(data=st.lists(datums(), min_size=0, max_size=4), loss=LOSS, config=CONFIG, forward_only=st.booleans())
    def fuzz(data, loss, config, forward_only):
        body = protobuf_body(ids["model_id"], data, loss, config, forward_only)
        answer = httpx.post(
            f"{url}/api/v1/forward_backward",
            content=body,
            headers={"Content-Type": "application/x-protobuf"},
            timeout=120,
        )
        check_answer(answer, f"forward_backward {loss} {config} {data!r:.300}")
        sent["count"] += 1
        if answer.status_code == 200:  # accepted: its result (or error) is an answer too
            sent["accepted"] += 1
            for _ in range(120):
                got = httpx.post(
                    f"{url}/api/v1/retrieve_future", json={"request_id": answer.json()["request_id"]}, timeout=120
                )
                check_answer(got, f"the result of forward_backward {loss} {data!r:.300}")
                if got.json().get("type") != "try_again":
                    break
            assert got.json().get("category") != "server", got.text  # a failure of the caller's making
        still_serving(url, ids)

    fuzz()
    step = httpx.post(
        f"{url}/api/v1/optim_step", json={"model_id": ids["model_id"], "optim_params": {"learning_rate": 1e-3}}
    )
    check_answer(step, "optim_step after the fuzzed data")
    assert step.status_code == 200
    record(
        record_property,
        f"forward_backward with arbitrary data ({sent['count']} protobuf requests: ids of the whole int32 range, "
        "any float32 incl. NaN / inf, ragged arrays, unknown losses and configs)",
        f"no 5xx; refused at the door or failed as a user error; {sent['accepted']} accepted and answered; "
        "the model still trains",
        "not needed (the server stayed up)",
        "-",
    )


def retrieve(url: str, request_id: str, what: str, accept: str = "application/json") -> httpx.Response:
    """A request's answer, polled as the SDK polls; checked like every answer."""
    for _ in range(120):
        got = httpx.post(
            f"{url}/api/v1/retrieve_future",
            json={"request_id": request_id},
            headers={"Accept": accept},
            timeout=120,
        )
        check_answer(got, what)
        if "json" not in got.headers["content-type"] or got.json().get("type") != "try_again":
            return got
    raise AssertionError(f"no answer to {what}")


STOP = (
    st.none()
    | st.text(max_size=3)
    | st.lists(st.text(max_size=3), max_size=3)
    | st.lists(st.integers(-5, 500), max_size=3)
)
ANY_FLOAT = st.floats() | st.sampled_from([0.0, 1.0, 1e-30, 1e30])


def test_sampling_fuzzed_with_arbitrary_parameters(live, record_property):
    """Well-formed prompts with any sampling parameters the request model admits: refused at the
    door, or sampled; an accepted request never fails as the server's fault."""
    url, ids = live
    sent = {"count": 0, "sampled": 0}

    @settings(FUZZ, max_examples=4 * CASES_PER_ROUTE)
    @given(
        prompt=st.lists(st.integers(0, 399), min_size=1, max_size=20),
        num_samples=st.integers(1, 4) | st.integers(-1, 5),
        params=st.fixed_dictionaries(  # each value usual or anything: some requests reach the engine
            {"max_tokens": st.integers(1, 30) | st.integers(-1, 40)},
            optional={
                "temperature": st.sampled_from([0.0, 0.7, 1.5]) | ANY_FLOAT,
                "top_k": st.sampled_from([-1, 1, 20]) | st.integers(-(2**40), 2**40),
                "top_p": st.sampled_from([0.5, 0.95, 1.0]) | ANY_FLOAT,
                "seed": st.integers(-(2**70), 2**70),
                "stop": STOP,
            },
        ),
        prompt_logprobs=st.booleans(),
        last_n=st.none() | st.none() | st.integers(-3, 25),
    )
    def fuzz(prompt, num_samples, params, prompt_logprobs, last_n):
        body = {
            "sampling_session_id": ids["sampling_session_id"],
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
            "num_samples": num_samples,
            "sampling_params": params,
            "prompt_logprobs": prompt_logprobs,
            "prompt_logprobs_last_n": last_n,
        }
        what = f"asample {json.dumps(json_safe(body))[:400]}"
        answer = httpx.post(f"{url}/api/v1/asample", content=json.dumps(json_safe(body)), headers=JSON, timeout=120)
        check_answer(answer, what)
        sent["count"] += 1
        if answer.status_code == 200:
            got = retrieve(url, answer.json()["request_id"], what, "application/x-protobuf")
            if "json" in got.headers["content-type"]:  # failed: of the caller's making
                assert got.json().get("category") == "user", f"{what}: {got.text}"
            else:
                sent["sampled"] += 1
        still_serving(url, ids)

    fuzz()
    assert sent["sampled"] > 0
    record(
        record_property,
        f"sampling with arbitrary parameters ({sent['count']} requests: temperature, top_k, top_p of any value incl. "
        "NaN / inf, seeds past 64 bits, stop strings and ids, num_samples and max_tokens out of range)",
        f"no 5xx; refused at the door or a user error; {sent['sampled']} sampled",
        "not needed (the server stayed up)",
        "-",
    )
