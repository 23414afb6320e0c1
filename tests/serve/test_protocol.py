"""The protocol's guarantees through the real SDK: a retried request is applied once, long
requests are polled, several clients at once, Ctrl-C finishes queued saves, and the
security defaults (loopback, API key, body size)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import tinker
import uvicorn
from _lib.serve_helpers import TEXTS, free_port, running_server, sft_data
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tinker import types

import trinity_like.client as ours


class FlakyProxy:
    """A network hop that loses the answer to the first POST of each path in ``lose``: the
    server got and ran the request, the SDK sees a 503 and sends it again."""

    def __init__(self, upstream: str, lose: set[str]) -> None:
        self.upstream, self.lose, self.lost = upstream, set(lose), []
        self.port = free_port()
        app = Starlette(routes=[Route("/{path:path}", self.forward, methods=["GET", "POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def forward(self, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.request(
                request.method, f"{self.upstream}{request.url.path}", content=await request.body(), headers=headers
            )
        if request.url.path in self.lose:
            self.lose.discard(request.url.path)
            self.lost.append(request.url.path)
            return Response(b'{"error": "lost on the way"}', status_code=503)
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_a_request_resent_after_a_lost_answer_is_applied_once(server, tiny_model, tmp_path):
    url, _ = server
    proxy = FlakyProxy(url, {"/api/v1/forward_backward", "/api/v1/optim_step"})
    with proxy as proxy_url:
        service = tinker.ServiceClient(base_url=proxy_url)
        remote = service.create_lora_training_client(tiny_model, rank=4, seed=3).result()
        data = sft_data(remote.get_tokenizer(), TEXTS)
        remote.forward_backward(data, "cross_entropy").result()
        step = remote.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = remote.forward(data, "cross_entropy").result().metrics["loss:sum"]
        service.close("success").result()
    assert sorted(proxy.lost) == ["/api/v1/forward_backward", "/api/v1/optim_step"]  # both were resent
    with ours.ServiceClient(log_dir=tmp_path) as local:
        once = local.create_lora_training_client(tiny_model, rank=4, seed=3)
        once.forward_backward(data, "cross_entropy").result()
        want = once.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        want_after = once.forward(data, "cross_entropy").result().metrics["loss:sum"]
    # a doubled backward would double the gradient norm; a doubled step would move the loss further
    assert step.metrics["grad_norm"] == pytest.approx(want.metrics["grad_norm"], rel=1e-4)
    assert after == pytest.approx(want_after, rel=1e-5)


def test_several_clients_long_polls_and_ctrl_c_finish_queued_work(tmp_path, tiny_model):
    """Two training clients (a LoRA on the folder, a full fine-tune of the built-in tiny model)
    with interleaved requests, results that take longer than a poll, and a Ctrl-C right after
    a save was queued: the save completes and the server exits 0."""
    data_dir = tmp_path / "data"
    port = free_port()
    with running_server(data_dir, "--poll-seconds", "0.01", port=port) as url:
        service = tinker.ServiceClient(base_url=url)
        lora = service.create_lora_training_client(tiny_model, rank=4, seed=1).result()
        full = service.create_lora_training_client("tiny-random", rank=0, seed=1).result()
        assert not full.get_info().is_lora
        futures = []
        for client in (lora, full, lora, full):
            data = sft_data(client.get_tokenizer(), TEXTS)
            futures.append(client.forward_backward(data, "cross_entropy"))
            futures.append(client.optim_step(types.AdamParams(learning_rate=1e-3)))
        results = [f.result() for f in futures]
        assert all(np.isfinite(r.metrics.get("loss:sum", 0.0)) for r in results)
        shared = lora.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(lora.get_tokenizer().encode("one plus"))
        samples = [shared.sample(prompt, 2, types.SamplingParams(max_tokens=4, seed=s)) for s in range(4)]
        assert all(len(f.result().sequences) == 2 for f in samples)
        for _ in range(3):
            lora.forward_backward(sft_data(lora.get_tokenizer(), TEXTS), "cross_entropy")
        save = lora.save_state("final")
        time.sleep(0.5)  # the save's POST is answered (queued) before Ctrl-C
        path = save.result().path if save.future().done() else None
    folder = data_dir / "runs" / lora.model_id / "state" / "final"
    assert folder.is_dir() and (folder / "base_model.json").is_file(), "the queued save did not complete"
    assert path is None or path.endswith("/weights/final")
    assert not list(folder.parent.glob(".*")), "a half-written checkpoint was left behind"


def test_security_defaults(tmp_path):
    cmd = [sys.executable, "-m", "trinity_like.cli", "serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--api-key" in out.stderr, out.stderr
    with running_server(tmp_path / "data", "--api-key", "tml-secret", "--max-body-mb", "0.01", key="tml-secret") as url:
        assert tinker.RestClient(base_url=url, api_key="tml-secret").get_server_capabilities().result()
        answer = httpx.post(f"{url}/api/v1/create_session", headers={"X-API-Key": "tml-wrong"}, json={})
        assert answer.status_code == 401
        big = httpx.post(f"{url}/api/v1/asample", headers={"X-API-Key": "tml-secret"}, content=b"x" * 20_000)
        assert big.status_code == 413 and "exceeds" in big.json()["error"]
        with pytest.raises(tinker.AuthenticationError):
            tinker.ServiceClient(base_url=url, api_key="tml-wrong").create_lora_training_client(
                "tiny-random", rank=2
            ).result()
