"""The README and the docs stay true to the code and to each other:

- the status box's list of settings and feature gates the controller accepts
  but ignores is exactly what `Settings::unimplemented` in
  src/operator/settings.rs warns about (`setting ignored` at start);
- the chart's README lists every value of charts/karpenter/values.yaml and
  marks each feature gate as settings.rs treats it;
- every relative link of the Markdown files resolves: the file or directory
  exists and, for a `#fragment` into a Markdown file, a heading (or an
  explicit anchor) of that name is in it.

Pure file reads: no cluster, no helm.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from chart_helpers import CHART, REPO_ROOT

README = REPO_ROOT / "README.md"
CHART_README = CHART / "README.md"
SETTINGS_RS = REPO_ROOT / "src" / "operator" / "settings.rs"

BOX_START = "<!-- ignored-settings:start -->"
BOX_END = "<!-- ignored-settings:end -->"
VALUES_START = "<!-- values:start -->"
VALUES_END = "<!-- values:end -->"


# --- what settings.rs warns about ---------------------------------------------------------------


def rust_fn_body(source: str, name: str) -> str:
    """The body of `fn name(...)` in `source`, braces balanced (string literals and comments
    of settings.rs hold no unbalanced braces outside format placeholders, which pair up)."""
    match = re.search(rf"\bfn {re.escape(name)}\s*\(", source)
    assert match, f"fn {name} not found in {SETTINGS_RS.relative_to(REPO_ROOT)}"
    start = source.index("{", match.end())
    depth = 0
    for i in range(start, len(source)):
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            depth -= 1
            if depth == 0:
                return source[start + 1 : i]
    raise AssertionError(f"fn {name}: unbalanced braces")


def warned_names() -> set[str]:
    """The names `Settings::unimplemented` can warn about.

    Each warning is an `out.push(...)` whose first string literal starts with what it is
    about: an environment variable (`INTERRUPTION_QUEUE (...) is set`), a setting's value
    (`PREFERENCE_POLICY=Ignore is not implemented`), or `feature gate {name}`, where the
    names are the first items of the `(name, enabled, explicit_only)` tuples the loop
    around it walks."""
    body = rust_fn_body(SETTINGS_RS.read_text(), "unimplemented")
    names: set[str] = set()
    pushes = list(re.finditer(r"\bout\.push\(", body))
    assert pushes, "no out.push(...) in Settings::unimplemented: has the warning moved?"
    for push in pushes:
        literal = re.compile(r'"((?:[^"\\]|\\.)*)"').search(body, push.end())
        assert literal, f"out.push without a string literal at {body[push.start():push.start() + 80]!r}"
        text = literal.group(1)
        if text.startswith("feature gate {name}"):
            gates = re.findall(r'\(\s*"([A-Za-z]+)"\s*,\s*gates\.\w+\s*,\s*(?:true|false)\s*\)', body)
            assert gates, "the feature-gate warning's (name, gate, explicit_only) tuples were not found"
            names.update(gates)
        else:
            lead = re.match(r"([A-Z][A-Z0-9_]+(?:=[A-Za-z]+)?)\b", text)
            assert lead, f"a warning that does not start with the setting it is about: {text!r}"
            names.add(lead.group(1))
    return names


def box_names() -> list[str]:
    """The first `code` span of each list item between the status box's markers."""
    text = README.read_text()
    assert BOX_START in text and BOX_END in text, f"README.md lacks {BOX_START} ... {BOX_END}"
    box = text.split(BOX_START, 1)[1].split(BOX_END, 1)[0]
    # The box may be a blockquote: its lines start with `>`.
    lines = [re.sub(r"^\s*>\s?", "", line) for line in box.splitlines()]
    items = [line for line in lines if re.match(r"\s*[-*] ", line)]
    names = []
    for item in items:
        code = re.search(r"`([^`]+)`", item)
        assert code, f"a status-box item without a `name`: {item!r}"
        names.append(code.group(1))
    return names


def test_settings_parser_finds_the_warnings() -> None:
    """The parser itself: the warnings settings.rs had when this test was written are still
    found (a rewrite of the function that the parser no longer understands fails here, not by
    silently finding nothing)."""
    names = warned_names()
    assert {"INTERRUPTION_QUEUE", "ENABLE_PROFILING", "IGNORE_DRA_REQUESTS=false"} <= names, names


def test_status_box_lists_what_the_controller_ignores() -> None:
    box = box_names()
    assert len(box) == len(set(box)), f"listed twice in the status box: {box}"
    code = warned_names()
    missing, extra = code - set(box), set(box) - code
    assert not missing and not extra, (
        "README.md's status box (between the ignored-settings markers) and the `setting ignored` "
        f"warnings of {SETTINGS_RS.relative_to(REPO_ROOT)} differ: "
        f"warned about but not listed: {sorted(missing)}; listed but never warned about: {sorted(extra)}"
    )


# --- the chart's README -------------------------------------------------------------------------


def value_keys(values: dict, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of values.yaml (a map whose default is empty is a leaf)."""
    keys = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in {"affinity", "strategy", "nodeSelector",
                                                              "podSecurityContext"}:
            keys += value_keys(value, path + ".")
        else:
            keys.append(path)
    return keys


def chart_readme_rows() -> dict[str, str]:
    """First `code` span of each row of the chart README's values table (between its
    `values:start` and `values:end` markers) -> the whole row."""
    text = CHART_README.read_text()
    assert VALUES_START in text and VALUES_END in text, f"charts/karpenter/README.md lacks {VALUES_START} ... {VALUES_END}"
    rows = {}
    for line in text.split(VALUES_START, 1)[1].split(VALUES_END, 1)[0].splitlines():
        cell = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if cell:
            assert cell.group(1) not in rows, f"{cell.group(1)} has two rows"
            rows[cell.group(1)] = line
    return rows


def has_value(values: dict, dotted: str) -> bool:
    node: object = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_chart_readme_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = chart_readme_rows()
    missing = [k for k in value_keys(values) if k not in rows]
    assert not missing, f"values of charts/karpenter/values.yaml missing from charts/karpenter/README.md: {missing}"
    unknown = [k for k in rows if not has_value(values, k)]
    assert not unknown, f"charts/karpenter/README.md lists values that values.yaml does not have: {unknown}"


def test_chart_readme_marks_each_feature_gate() -> None:
    ignored = warned_names()
    rows = chart_readme_rows()
    gates = yaml.safe_load((CHART / "values.yaml").read_text())["settings"]["featureGates"]
    for key in gates:
        row = rows.get(f"settings.featureGates.{key}")
        assert row, f"settings.featureGates.{key} has no row in charts/karpenter/README.md"
        gate = key[0].upper() + key[1:]
        want = "ignored" if gate in ignored else "implemented"
        assert f"**{want}**" in row, f"settings.featureGates.{key} should be marked **{want}**: {row}"


# --- relative links -----------------------------------------------------------------------------


def markdown_files() -> list[Path]:
    files = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
    files += sorted((REPO_ROOT / "charts").glob("*/README.md"))
    return files


def without_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked out."""
    text = re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: Markdown markup dropped, lower case, punctuation other
    than `-` and `_` removed, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in text.splitlines():
        if re.match(r"^ {0,3}(```|~~~)", line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    found.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', text))
    return found


def relative_links(path: Path) -> list[str]:
    text = without_code(path.read_text())
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, flags=re.M)  # reference definitions
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # no http:, mailto:, ...


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: {file_part} does not exist")
            continue
        if REPO_ROOT not in dest.parents and dest != REPO_ROOT:
            broken.append(f"{target}: outside the repository")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{fragment} in {dest.relative_to(REPO_ROOT)}")
    assert not broken, f"{path.relative_to(REPO_ROOT)}: broken links:\n  " + "\n  ".join(broken)


def test_slugs_as_github_makes_them() -> None:
    assert slug("1.2 Interruption queue") == "12-interruption-queue"
    assert slug("Watching nodes and cost: `karpenter top`") == "watching-nodes-and-cost-karpenter-top"
    assert slug("Cost and utilisation metrics, dashboards") == "cost-and-utilisation-metrics-dashboards"
    assert slug("What a change would do to the live cluster") == "what-a-change-would-do-to-the-live-cluster"
