"""Shared test helpers: random batches, a finite-difference gradient, list-backed buffer doubles."""

from __future__ import annotations

import dataclasses

import torch

from trinity_like.experience import Experience

DT = torch.float64


def rand_mask(B: int, R: int, gen: torch.Generator, empty_rows: int = 0) -> torch.Tensor:
    """Right-padded response masks of random lengths 1..R; the first ``empty_rows`` rows are empty."""
    lengths = torch.randint(1, R + 1, (B,), generator=gen)
    lengths[:empty_rows] = 0
    return (torch.arange(R).unsqueeze(0) < lengths.unsqueeze(1)).to(DT)


def rand_batch(B: int = 6, R: int = 7, seed: int = 0, empty_rows: int = 1) -> dict[str, torch.Tensor]:
    """A token-level batch: every field a loss may ask for, float64."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, R, generator=g, dtype=DT) * 3 - 0.05
    values = torch.randn(B, R, generator=g, dtype=DT)
    return {
        "logprob": old + 0.3 * torch.randn(B, R, generator=g, dtype=DT),
        "old_logprob": old,
        "ref_logprob": old + 0.3 * torch.randn(B, R, generator=g, dtype=DT),
        "advantages": torch.randn(B, R, generator=g, dtype=DT),
        "action_mask": rand_mask(B, R, g, empty_rows),
        "entropy": torch.rand(B, R, generator=g, dtype=DT) * 2,
        "values": values + 0.4 * torch.randn(B, R, generator=g, dtype=DT),
        "old_values": values,
        "returns": torch.randn(B, R, generator=g, dtype=DT),
        "is_expert": torch.arange(B) % 3 == 2,
        "rollout_logprob": old + 0.3 * torch.randn(B, R, generator=g, dtype=DT),  # drawn last: the others stay
    }


def fd_grad(f, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of the scalar ``f(x)`` (float64)."""
    grad = torch.zeros_like(x)
    flat, gflat = x.detach().clone().reshape(-1), grad.reshape(-1)
    for i in range(flat.numel()):
        hi, lo = flat.clone(), flat.clone()
        hi[i] += eps
        lo[i] -= eps
        gflat[i] = (f(hi.reshape(x.shape)) - f(lo.reshape(x.shape))).item() / (2 * eps)
    return grad


def autograd_grad(f, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x), x)
    return g


# -- test doubles of the buffer protocols (trinity_like.buffer.base) ----------------------
class ListSource:
    """A list-backed ExperienceSource: rows are available, claimed, consumed or dropped."""

    def __init__(self, rows: list[Experience] = ()) -> None:
        self.rows: list[Experience] = []
        self.status: dict[str, str] = {}
        self.put(list(rows))

    def put(self, rows):
        for r in rows:
            self.rows.append(r)
            self.status[r.eid] = "available"

    def claim(self, n, *, order="fifo", min_model_version=None, timeout=None):
        avail = [r for r in self.rows if self.status[r.eid] == "available"]
        if min_model_version is not None:
            avail = [r for r in avail if r.model_version >= min_model_version]
        if order == "newest_version":
            avail = sorted(avail, key=lambda r: -r.model_version)  # stable: fifo within a version
        out = avail[:n]
        for r in out:
            self.status[r.eid] = "claimed"
        return [dataclasses.replace(r) for r in out]

    def drop_older_than(self, model_version):
        n = 0
        for r in self.rows:
            if self.status[r.eid] == "available" and r.model_version < model_version:
                self.status[r.eid] = "dropped"
                n += 1
        return n

    def commit(self, step):
        for eid, s in self.status.items():
            if s == "claimed":
                self.status[eid] = "consumed"

    def count(self, status="available"):
        return sum(1 for s in self.status.values() if s == status)

    def mark_writer_done(self):
        pass  # claims never wait here: a list holds everything it will ever hold

    def recover(self, checkpoint_step=None):
        return {}  # nothing kept across runs

    def close(self):
        pass


class ListExpert:
    """A list-backed ExpertSource cycling through its rows."""

    def __init__(self, rows: list[Experience]) -> None:
        self.rows, self.pos = rows, 0

    def next_batch(self, n):
        out = []
        for _ in range(n):
            out.append(dataclasses.replace(self.rows[self.pos % len(self.rows)]))
            self.pos += 1
        return out


def experience(version: int = 0, length: int = 3, reward: float = 1.0, group: str = "g") -> Experience:
    return Experience(
        tokens=[1, 2] + [5] * length, prompt_length=2, reward=reward, group_id=group, model_version=version
    )
