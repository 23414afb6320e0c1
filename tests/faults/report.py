"""The fault table: run the fault suite and write what it showed into docs/reliability.md.

    python tests/faults/report.py            # runs tests/faults (a few minutes), rewrites the table
    python tests/faults/report.py --junit F  # renders the table from an earlier run's JUnit XML

Each fault test records its row with ``faultlib.record`` (fault, outcome, resumed, rows
lost / trained twice); the bad-input cases become one summary row. A test that failed
shows as FAILED in its row, so the table is never better than the run that produced it;
a known bug (a strict xfail) shows the row it recorded, which names the bug.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
START, END = "<!-- fault-table:start -->", "<!-- fault-table:end -->"
HEADER = ["fault injected", "what the run did", "resumed with the same command", "buffer rows lost / twice"]


def rows_from_junit(xml_text: str) -> list[list[str]]:
    """One table row per recording test, plus one for the bad-input cases."""
    rows, bad_total, bad_ok = [], 0, 0
    for case in ET.fromstring(xml_text).iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped")
        # an expected failure (a known bug, xfail) keeps the row it recorded, which says so
        if skipped is not None and skipped.get("type") != "pytest.xfail":
            continue
        if case.get("name", "").startswith("test_bad_input_is_one_line_and_writes_nothing"):
            bad_total += 1
            bad_ok += not failed
            continue
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "fault" not in props:
            # a fault test (tests/faults) that failed before recording its row still shows; the
            # report's own tests (test_report.py) check the table itself, and a failure elsewhere in a
            # whole-suite run is not a fault
            classname = case.get("classname", "")
            if failed and classname.startswith("tests.faults.") and not classname.endswith("test_report"):
                rows.append([f"{case.get('classname', '')}::{case.get('name', '')}", "FAILED", "FAILED", "FAILED"])
            continue
        if failed:
            rows.append([props["fault"], "FAILED", "FAILED", "FAILED"])
        else:
            rows.append([props["fault"], props["outcome"], props["resumed"], props["rows"]])
    if bad_total:
        rows.insert(
            0,
            [
                f"bad input: {bad_total} recipes, overrides, plugins and data files",
                f"clean one-line error, exit 2, no run directory: {bad_ok}/{bad_total}",
                "-",
                "-",
            ],
        )
    return rows


def render(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_table(table: str, doc: Path = DOC) -> None:
    text = doc.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{doc}: no {START} ... {END} markers to write the table between")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    note = "Written by `python tests/faults/report.py` from a run of `tests/faults`; do not edit by hand."
    doc.write_text(f"{head}{START}\n{note}\n\n{table}\n{END}{tail}", encoding="utf-8")


def run_suite(junit: Path) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=legacy",
        f"--junitxml={junit}",
        str(REPO / "tests" / "faults"),
    ]
    return subprocess.run(cmd, cwd=REPO).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/faults/report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="render from this JUnit XML instead of running the suite")
    parser.add_argument("--doc", type=Path, default=DOC, help="the markdown file whose table is rewritten")
    args = parser.parse_args(argv)
    status = 0
    if args.junit is None:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "faults.xml"
            status = run_suite(junit)
            xml_text = junit.read_text(encoding="utf-8")
    else:
        xml_text = args.junit.read_text(encoding="utf-8")
    table = render(rows_from_junit(xml_text))
    write_table(table, args.doc)
    print(table)
    return status


if __name__ == "__main__":
    sys.exit(main())
