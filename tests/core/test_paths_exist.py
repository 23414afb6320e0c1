"""Every path the project mentions exists in the repository, so a maintainer can open it.

What counts as a path: a token that starts with one of the repository's tracked top-level folders
(``trinity_like/``, ``tests/``, ``docs/``, ``benchmarks/``, ``examples/`` ...; also ``notes/``,
which is not one, so a reference to it fails) followed by at least one more name, with an
optional ``:LINE`` (then the file must have that many lines); and a bare upper-case Markdown name
(``README.md``, ``RESULTS.md``), which must exist somewhere in the tree. A token preceded by ``/``,
``.``, ``~`` or a word character is part of something else (a URL, ``../x``, ``my_tests/x``).

A token resolves if the path exists; if it names no extension, also as the stem of an existing
file (``--out benchmarks/results/rollout`` writes ``rollout.md``); a ``*`` must match a file; in
``{a,b}`` every alternative must exist. Placeholders (``runs/<name>``, ``{name}`` without a comma)
are templates, not paths. Runtime folders are allowed only through ``ALLOWED`` below.

Where: Markdown, TOML, YAML and shell files as whole text; Python files' comments and string
constants (docstrings, help texts, messages; f-strings are templates and skipped), except under
``tests/``, where only comments and docstrings count (a test may name a missing file on purpose).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Prefixes (or exact tokens) that name something other than a committed file, with the reason.
# A token is allowed if it starts with one of them.
ALLOWED: dict[str, str] = {
    "runs/": "every run writes its folder under runs/ (git-ignored); docs name the folders a command creates",
    "benchmarks/results/gpu_check": "written by `python benchmarks/gpu_check.py` on a GPU; none has run yet",
    "trinity_like/chatml": "a renderer's registered name (examples/serve/cookbook_rl.py), not a path",
    "OUT.md": "the file a benchmark's --out OUT writes, a placeholder",
    "PATH.md": "the file `trinity-like compare --report PATH` writes, a placeholder",
}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if (ROOT / name).is_file()]


FILES = _tracked()
TOPS = sorted({name.split("/")[0] for name in FILES if "/" in name} | {"notes", "runs"})
PREFIX = "|".join(re.escape(top) for top in TOPS)
TOKEN = re.compile(rf"(?<![\w./~-])((?:{PREFIX})/[\w.*/{{}},<>-]*[\w*}}>])(?::(\d+))?")
BARE_DOC = re.compile(r"(?<![\w./~-])([A-Z][A-Z_]+\.md)\b")
TEXT_SUFFIXES = (".md", ".toml", ".yaml", ".yml", ".sh")


def _python_texts(path: Path, source: str, in_tests: bool) -> Iterator[tuple[int, str]]:
    """(line, text) of the comments and the string constants worth checking in one Python file."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    tree = ast.parse(source, str(path))
    templates = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in templates
        if is_text and (not in_tests or id(node) in docstrings):
            for offset, line in enumerate(node.value.splitlines()):
                yield node.lineno + offset, line


def _texts(name: str) -> Iterator[tuple[int, str]]:
    path = ROOT / name
    if name.endswith(".py"):
        yield from _python_texts(path, path.read_text(), name.startswith("tests/"))
    elif name.endswith(TEXT_SUFFIXES):
        yield from enumerate(path.read_text().splitlines(), 1)


def _alternatives(token: str) -> list[str] | None:
    """The paths a token stands for; None for a template (``<name>``, ``{name}``)."""
    if "<" in token or ">" in token:
        return None
    match = re.search(r"\{([^{}]*)\}", token)
    if match is None:
        return [token]
    if "," not in match.group(1):
        return None
    paths: list[str] = []
    for choice in match.group(1).split(","):
        expanded = _alternatives(token[: match.start()] + choice + token[match.end() :])
        if expanded is None:
            return None
        paths += expanded
    return paths


def _resolves(path: str, line: str | None) -> bool:
    path = path.rstrip(".,/")
    if "*" in path:
        return any(ROOT.glob(path))
    target = ROOT / path
    if not target.exists():
        return "." not in Path(path).name and any(target.parent.glob(target.name + ".*"))
    if line is not None:
        return target.is_file() and len(target.read_text().splitlines()) >= int(line)
    return True


def _allowed(token: str) -> bool:
    return token.startswith(tuple(ALLOWED))


def missing_paths() -> list[str]:
    basenames = {Path(name).name for name in FILES}
    missing = []
    for name in FILES:
        for lineno, text in _texts(name):
            for match in TOKEN.finditer(text):
                token, line = match.group(1), match.group(2)
                if _allowed(token):
                    continue
                paths = _alternatives(token)
                if paths is not None and not all(_resolves(p, line) for p in paths):
                    missing.append(f"{name}:{lineno}: {token}{':' + line if line else ''}")
            for match in BARE_DOC.finditer(text):
                if match.group(1) not in basenames and not _allowed(match.group(1)):
                    missing.append(f"{name}:{lineno}: {match.group(1)}")
    return missing


def test_every_mentioned_path_exists() -> None:
    missing = missing_paths()
    assert not missing, "paths mentioned but not in the repository:\n" + "\n".join(missing)


def test_the_check_sees_missing_paths(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing line, a notes/ reference and a bare design doc
    are caught; an existing file, a stem, a glob, braces and templates pass."""
    assert _alternatives("benchmarks/results/async.{json,md}") == [
        "benchmarks/results/async.json",
        "benchmarks/results/async.md",
    ]
    assert _alternatives("runs/<name>/sync") is None and _alternatives("examples/{name}.yaml") is None
    assert _resolves("trinity_like/registry.py", None) and not _resolves("trinity_like/registry.py", "100000")
    assert _resolves("benchmarks/results/rollout", None) and _resolves("examples/*.yaml", None)
    assert not _resolves("notes/gpu.md", None) and not _resolves("examples/*.nope", None)
    text = "see notes/gpu.md, trinity_like/nowhere.py:3, DESIGN.md, https://x.org/docs/a.md and docs/gpu.md"
    found = [m.group(1) for m in TOKEN.finditer(text)] + [m.group(1) for m in BARE_DOC.finditer(text)]
    assert found == ["notes/gpu.md", "trinity_like/nowhere.py", "docs/gpu.md", "DESIGN.md"]
    source = '"""Doc: docs/a.md."""\n# c: docs/b.md\nx = "docs/c.md"\ny = f"docs/{x}.md"\n'
    assert [t for _, t in _python_texts(tmp_path / "m.py", source, in_tests=True)] == [
        "# c: docs/b.md",
        "Doc: docs/a.md.",
    ]
    assert sorted(t for _, t in _python_texts(tmp_path / "m.py", source, in_tests=False)) == [
        "# c: docs/b.md",
        "Doc: docs/a.md.",
        "docs/c.md",
    ]
