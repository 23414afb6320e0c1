"""Every page of the documentation points at things that exist: each relative link (from the page's
folder) and each repository path it names in backticks (from the repository root). What a page says and
how long it is are its own; the commands it shows are run by the tests beside each topic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    {
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("plugins/**/*.md"),
        *ROOT.glob("benchmarks/**/*.md"),
        *ROOT.glob("cookbook/**/*.md"),
        *ROOT.glob("examples/**/*.md"),
    }
)
FOLDERS = "docs|benchmarks|examples|plugins|trinity_like|cookbook|algorithms|tests|scripts"
# a path with a placeholder, a glob or a variable in it names a family of files, not one
PATH = re.compile(rf"`((?:{FOLDERS})/[^`\s<>*{{}}$]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_pages_are_found():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "contributing.md" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves_inside_the_repository(page):
    for link in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in link or link.startswith(("#", "mailto:")):
            continue
        target = (page.parent / link.split("#")[0]).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), f"{page_id(page)}: {link}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_repository_path_named_exists(page):
    for path in PATH.findall(page.read_text(encoding="utf-8")):
        path = path.split("#")[0].split(":")[0].rstrip(",.;")
        assert (ROOT / path).exists(), f"{page_id(page)}: {path}"
