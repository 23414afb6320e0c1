"""``trinity-like serve``'s settings: one frozen object, checked before anything starts.

Example::

    params = ServeParams(data_dir=Path("serve-data"), port=8000)
    params.check()          # e.g. a non-loopback host without an API key is refused; makes data_dir
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from trinity_like.errors import ConfigError
from trinity_like.registry import TRAIN_ENGINE

LOOPBACK_NAMES = ("localhost",)
POSITIVE = {  # fields that must be >= 1, and how a user names them
    "max_body_bytes": "--max-body-mb (in bytes)",
    "max_pending": "--max-pending",
    "keep_results": "keep_results",
    "micro_batch_size": "--micro-batch-size",
    "max_num_samples": "--max-num-samples",
    "max_batch_datums": "--max-batch-datums",
    "max_models": "--max-models",
    "max_samplers": "--max-samplers",
}


@dataclass(frozen=True)
class ServeParams:
    """Where the server listens, what it keeps and how much it takes at once."""

    data_dir: Path  # tinker:// paths live here: <data_dir>/runs/<model id>/{state,sampler_weights}/<name>
    host: str = "127.0.0.1"  # address to bind; any non-loopback address needs api_key
    port: int = 8000  # TCP port (0: any free port)
    api_key: str | None = None  # when set, every request must carry it (X-API-Key); "tml-" + anything
    max_body_bytes: int = 64 * 1024 * 1024  # larger request bodies are refused (HTTP 413)
    max_pending: int = 512  # requests queued or running at once; beyond it HTTP 429 (the SDK retries)
    keep_results: int = 4096  # finished results kept for retrieval (oldest forgotten first)
    poll_seconds: float = 10.0  # how long a retrieve waits for a result before answering "try again"
    max_num_samples: int = 128  # samples one sample request may ask for (the rollout engine's batch)
    max_batch_datums: int = 1024  # datums of one forward_backward request; told to the SDK, which splits larger ones
    max_models: int = 4  # training clients held at once (each: weights, gradients, Adam state); more is HTTP 400
    max_samplers: int = 8  # sampling sessions kept, least recently used let go first (a snapshot: a weights copy)
    train_engine: str = "local"  # a TRAIN_ENGINE name: "local" (in-process), "verl" (workers through Ray), a plugin's
    micro_batch_size: int = 8  # rows per forward/backward pass of a train engine
    dtype: str = "float32"  # the training weights' dtype
    models: tuple[str, ...] = ()  # model ids or folders listed by get_server_capabilities beside the built-ins

    def check(self) -> None:
        """One-line errors naming the option, before any port is bound; makes ``data_dir`` if missing."""
        if self.api_key is None and not is_loopback(self.host):
            raise ConfigError(
                f"--host {self.host}: serving beyond this machine needs --api-key (or TRINITY_LIKE_SERVE_API_KEY)"
            )
        if self.api_key is not None and not self.api_key.startswith("tml-"):
            raise ConfigError("--api-key must start with 'tml-' (the tinker SDK refuses other keys)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not a TCP port")
        if self.train_engine not in TRAIN_ENGINE:
            raise ConfigError(f"--train-engine: {TRAIN_ENGINE.unknown_message(self.train_engine)}")
        for name, flag in POSITIVE.items():
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if not self.poll_seconds > 0:
            raise ConfigError(f"--poll-seconds must be > 0, got {self.poll_seconds}")
        try:
            if self.data_dir.exists() and not self.data_dir.is_dir():
                raise ConfigError(f"--data-dir {self.data_dir}: a file is there, not a folder")
            (self.data_dir / "runs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # too long a name, no permission, a file on the way
            raise ConfigError(f"--data-dir {self.data_dir}: cannot use it ({exc.strerror})") from None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
