"""A client-loop stand-in for the failure test: writes metrics.jsonl, and dies on the seed it is told to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, required=True)
p.add_argument("--log-path", required=True)
p.add_argument("--fail-seed", type=int, default=-1)
args = p.parse_args()
out = Path(args.log_path)
out.mkdir(parents=True, exist_ok=True)
with open(out / "metrics.jsonl", "w") as fh:
    fh.write(json.dumps({"step": 0, "eval/accuracy": 0.0}) + "\n")
    if args.seed == args.fail_seed:
        raise SystemExit(f"seed {args.seed}: the loss diverged at step 1")
    for step in (1, 2):
        fh.write(json.dumps({"step": step, "reward/mean": 0.1 * step, "time/step": 0.5}) + "\n")
    fh.write(json.dumps({"step": 2, "eval/accuracy": 0.25}) + "\n")
