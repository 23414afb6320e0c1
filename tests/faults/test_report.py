"""The fault table command renders what the suite recorded, failures included."""

from __future__ import annotations

from _lib.scripts import load_script

report = load_script("tests/faults/report.py")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="a" name="test_bad_input_is_one_line_and_writes_nothing[x]"/>
<testcase classname="a" name="test_bad_input_is_one_line_and_writes_nothing[y]"><failure message="no"/></testcase>
<testcase classname="b" name="test_kill"><properties><property name="fault" value="SIGKILL at a"/>
<property name="outcome" value="killed"/><property name="resumed" value="yes (3 s)"/><property name="rows" value="0 lost, 0 twice"/></properties></testcase>
<testcase classname="b" name="test_lock"><properties><property name="fault" value="second run"/>
<property name="outcome" value="x"/><property name="resumed" value="y"/><property name="rows" value="z"/></properties><failure message="boom"/></testcase>
<testcase classname="tests.faults.test_c" name="test_helper"/>
<testcase classname="tests.faults.test_c" name="test_early"><failure message="before recording"/></testcase>
<testcase classname="tests.core.test_plugins" name="test_elsewhere"><failure message="not a fault test"/></testcase>
<testcase classname="tests.faults.test_report" name="test_the_doc"><failure message="not a fault"/></testcase>
<testcase classname="d" name="test_known"><properties><property name="fault" value="resume"/>
<property name="outcome" value="KNOWN BUG: x"/><property name="resumed" value="yes"/><property name="rows" value="1 twice"/></properties>
<skipped type="pytest.xfail" message="known bug"/></testcase>
<testcase classname="d" name="test_no_ray"><properties><property name="fault" value="skipped one"/></properties>
<skipped type="pytest.skip" message="no ray"/></testcase>
</testsuite></testsuites>"""


def test_rows_come_from_recorded_properties_and_failures_show(tmp_path):
    rows = report.rows_from_junit(JUNIT)
    assert rows == [
        [
            "bad input: 2 recipes, overrides, plugins and data files",
            "clean one-line error, exit 2, no run directory: 1/2",
            "-",
            "-",
        ],
        ["SIGKILL at a", "killed", "yes (3 s)", "0 lost, 0 twice"],
        ["second run", "FAILED", "FAILED", "FAILED"],
        # failed before recording a row: shown by its name (a failure outside tests/faults is not a fault)
        ["tests.faults.test_c::test_early", "FAILED", "FAILED", "FAILED"],
        ["resume", "KNOWN BUG: x", "yes", "1 twice"],  # a strict xfail keeps its row; a skip has none
    ]
    doc = tmp_path / "r.md"
    doc.write_text(f"# t\n\n{report.START}\nold\n{report.END}\n\nafter\n")
    (tmp_path / "f.xml").write_text(JUNIT)
    assert report.main(["--junit", str(tmp_path / "f.xml"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.endswith(f"| resume | KNOWN BUG: x | yes | 1 twice |\n{report.END}\n\nafter\n")
    assert "| fault injected | what the run did |" in text


def test_the_doc_holds_a_generated_table():
    text = report.DOC.read_text()
    table = text.partition(report.START)[2].partition(report.END)[0]
    assert "Written by `python tests/faults/report.py`" in table and "| fault injected |" in table
    assert "FAILED" not in table
