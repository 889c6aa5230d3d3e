"""`make bench` records its scale runs in docs/benchmarks.md.

`record_scale_results` (hack/lib.sh) appends a run's `SCALE RESULT` lines, under the date, the
commit, the machine and the command, to the section that ends docs/benchmarks.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from chart_helpers import REPO_ROOT

BENCHMARKS = REPO_ROOT / "docs" / "benchmarks.md"


def record(command: str, output: str, tmp_path: Path) -> str:
    out = tmp_path / "run.out"
    out.write_text(output)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    script = 'source hack/lib.sh && record_scale_results "$1" "$2" "$3"'
    args = ["bash", "-c", script, "record", command, str(out), str(doc)]
    subprocess.run(args, cwd=REPO_ROOT, check=True)
    return doc.read_text()


def test_a_runs_summary_lines_are_appended_with_its_command(tmp_path: Path) -> None:
    output = (
        "running 1 test\n"
        "test two_thousand_nodes_with_kwok ... SCALE RESULT: 2000 pods, $HOME `x`\n"
        "some other line\n"
        "SCALE RESULT: CPU seconds until all Running: karpenter 29 s\n"
        "test result: ok. 1 passed\n"
    )
    doc = record("KARPENTER_BIN=bin cargo test two_thousand_nodes_with_kwok", output, tmp_path)
    date = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
    heading = re.search(rf"^### {date}, (.+), (\d+) cores, (\d+) GiB$", doc, re.M)
    assert heading, doc
    assert "```sh\nKARPENTER_BIN=bin cargo test two_thousand_nodes_with_kwok\n```" in doc
    lines = [line for line in doc.splitlines() if line.startswith("- ")]
    assert lines == [
        "- SCALE RESULT: 2000 pods, $HOME `x`",
        "- SCALE RESULT: CPU seconds until all Running: karpenter 29 s",
    ]


def test_a_run_without_results_appends_nothing(tmp_path: Path) -> None:
    assert record("cargo test x", "test x ... FAILED\n", tmp_path) == "# Benchmarks\n"


def test_the_recorded_runs_are_the_last_section_of_the_benchmarks() -> None:
    headings = re.findall(r"^## (.+)$", BENCHMARKS.read_text(), re.M)
    assert headings[-1] == "Runs recorded by `make bench`"
