"""What naming the weights costs per sync, against a main-job step (docs/reliability.md).

    python benchmarks/weight_digest.py            # SmolLM2-135M's shape, random weights, 21 repetitions

Per sync the trainer digests the fp32 weights it sends, in the sampler's dtype (bf16 on a
CPU with bf16 units: the main job's default), and the rollout engine digests its bf16
model after the load. Both are timed here, interleaved, on the same weights; the medians
are set against the main job's step median (README: 5.0 s, AMD EPYC 2 cores). The values
of random weights do not change the work: every tensor's sample is the same size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_name, interleaved, timer  # noqa: E402

from trinity_like.models.shapes import shaped_model  # noqa: E402
from trinity_like.models.weight_digest import model_digest, weights_digest  # noqa: E402

MAIN_STEP_S = 5.0  # the README's main-job step median on this machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    trainer = shaped_model("smollm2-135m", device="cpu", dtype=torch.float32)
    sampler = shaped_model("smollm2-135m", device="cpu", dtype=torch.bfloat16)
    sampler.load_state_dict(trainer.state_dict())
    sent = trainer.state_dict()
    assert weights_digest(sent, dtype=torch.bfloat16) == model_digest(sampler)  # the two sides agree
    sides = {"trainer (sent, fp32 -> bf16)": lambda: weights_digest(sent, dtype=torch.bfloat16)}
    sides["engine (held, bf16)"] = lambda: model_digest(sampler)
    times = interleaved(lambda side, _round: timer(sides[side]), list(sides), args.reps)  # load drifts hit both alike
    params = sum(t.numel() for t in sent.values()) / 1e6
    print(f"SmolLM2-135M shape ({params:.1f} M parameters, {len(sent)} tensors), {cpu_name()}, "
          f"{torch.get_num_threads()} threads, {args.reps} repetitions")  # fmt: skip
    medians = {label: statistics.median(values) for label, values in times.items()}
    print("\n".join(f"  {label}: median {median * 1e3:.1f} ms" for label, median in medians.items()))
    total = sum(medians.values())
    print(f"  per sync: {total * 1e3:.1f} ms = {100 * total / MAIN_STEP_S:.2f} % of a {MAIN_STEP_S} s main-job step")


if __name__ == "__main__":
    main()
