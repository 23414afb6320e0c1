#!/usr/bin/env bash
# Assembles what must travel to a lent GPU machine for benchmarks/gpu_check.py, and prints the one
# command that runs the check there (docs/gpu.md, "Running the GPU check").
#
# The machine (docs/machines.md) has Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, tokenizers,
# peft, accelerate, safetensors, numpy, pytest, pyyaml, psutil, tqdm and no network. The recipe
# path, the engines and the CUDA tests also need the pure-Python packages below; they travel as
# wheels in .whl/ (under 4 MB; git ignores the folder, the run call carries it). Nothing else:
# the local engine with an in-process explorer never imports Ray, verl, datasets or tensorboard
# (tests/examples/test_gpu_check_benchmark.py runs that path with Ray unimportable).
#
#   bash scripts/gpu_wheels.sh            # fills .whl/ (from this machine's package index)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
)
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
echo "gpu_wheels: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
# The command as docs/gpu.md shows it, with <sha> filled in: the machine's copy has no repository.
sha=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
sed "s/<sha>/${sha}/" <<'EOF'
Run the check on the device machine (one call, carry .whl, timeout_s 450):
  set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && python3 benchmarks/gpu_check.py --commit <sha> --out $OUT/gpu_check 2>&1 | tee $OUT/gpu_check.log
Everything comes back under $OUT (gpu_check.json, gpu_check.md, gpu_check.log, gpu_check_logs/);
copy gpu_check.json and gpu_check.md into benchmarks/results/.
EOF
