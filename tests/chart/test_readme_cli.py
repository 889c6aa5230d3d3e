"""The README's commands and settings exist in the binary as written.

Every `karpenter ...` command line in README.md's shell blocks names subcommands the binary has
(`karpenter <sub...> --help` succeeds), with options that subcommand takes; every setting the
README names as `NAME` (with a default in parentheses, where it gives one) is an environment
variable of `karpenter controller`, with that default. Reads the debug binary `make test` builds
before it runs these tests.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from chart_helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
BINARY = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target")) / "debug" / "karpenter"

pytestmark = pytest.mark.skipif(
    not BINARY.exists(), reason=f"{BINARY} is not built (make test builds it before these tests)"
)


@functools.cache
def help_of(*words: str) -> str:
    proc = subprocess.run([str(BINARY), *words, "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"karpenter {' '.join(words)} --help failed:\n{proc.stderr}"
    return proc.stdout


def subcommands(help_text: str) -> set[str]:
    """The names in the `Commands:` section of a clap help text."""
    names: set[str] = set()
    in_commands = False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            in_commands = True
            continue
        if in_commands:
            if not line.startswith("  "):
                break
            names.add(line.split()[0])
    return names


def shell_lines() -> list[str]:
    """Command lines of the README's sh/bash/console blocks, continuations joined, comments cut."""
    lines: list[str] = []
    block = None
    pending = ""
    for raw in README.read_text().splitlines():
        fence = raw.strip()
        if fence.startswith("```"):
            block = None if block is not None else fence[3:].strip()
            continue
        if block not in ("sh", "bash", "shell", "console"):
            continue
        if block == "console" and not raw.startswith("$ "):
            continue  # a console block's output
        # A comment's `or: <command>` is a command too.
        alternative = re.search(r"#\s*or:\s*(.*)$", raw)
        if alternative:
            lines.append(alternative.group(1))
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        line = line.removeprefix("$ ")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def karpenter_invocations() -> list[list[str]]:
    """The argument lists of every `karpenter ...` call in a shell block (also after `|`, `&&` or
    `$(`) or an inline code span of the prose."""
    calls = []
    spans = [f"karpenter {m}" for m in re.findall(r"`karpenter ([^`]+)`", README.read_text())]
    for line in shell_lines() + spans:
        for part in re.split(r"\|\||&&|\||;|\$\(", line):
            try:
                words = shlex.split(part, comments=False)
            except ValueError:
                words = part.split()
            for i, word in enumerate(words):
                if word in ("karpenter", "./target/debug/karpenter", "target/release/karpenter") and (
                    i == 0 or "=" in words[i - 1] or words[i - 1] in ("exec", "time")
                ):
                    calls.append(words[i + 1 :])
                    break
    return calls


def test_the_readme_shows_karpenter_commands() -> None:
    assert len(karpenter_invocations()) >= 10, "the parser finds the README's commands"


@pytest.mark.parametrize("args", karpenter_invocations(), ids=lambda a: " ".join(a)[:60] or "(none)")
def test_every_command_the_readme_shows_exists(args: list[str]) -> None:
    path: list[str] = []
    rest = list(args)
    # Where a command has subcommands, a word that is no option must name one.
    while rest and not rest[0].startswith("-") and subcommands(help_of(*path)):
        assert rest[0] in subcommands(help_of(*path)), (
            f"karpenter {' '.join(path)} has no subcommand {rest[0]} (README: karpenter {' '.join(args)})"
        )
        path.append(rest.pop(0))
    text = help_of(*path)
    for word in rest:
        if not word.startswith("--"):
            continue
        flag = word.split("=")[0]
        assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s=<,]|$)", text, re.M), (
            f"karpenter {' '.join(path)} has no option {flag} (README: karpenter {' '.join(args)})"
        )


def settings_named() -> dict[str, str | None]:
    """`NAME` (default) pairs of the README's paragraph on the controller's settings."""
    text = README.read_text()
    start = text.index("### Running the controller yourself")
    section = text[start : text.index("\n## ", start)]
    found: dict[str, str | None] = {}
    for match in re.finditer(r"`([A-Z][A-Z0-9_]{3,})`(?: \(([^)]*)\))?", section):
        name, paren = match.group(1), match.group(2)
        default = None
        if paren:
            first = paren.split(",")[0].strip().strip("`")
            # A default reads like a value: `1s`, `8080`, `false`, `5m`; prose is not one.
            if re.fullmatch(r"[0-9A-Za-z.]+", first) and not first.istitle() and first not in ("required",):
                default = first
        found.setdefault(name, default)
    return found


def controller_env() -> dict[str, str | None]:
    """Environment variables of `karpenter controller --help`, with their defaults."""
    out: dict[str, str | None] = {}
    blocks = re.split(r"\n\s*\n(?=\s+-)", help_of("controller"))
    for block in re.split(r"\n(?=\s{2,}(?:-\w, )?--)", help_of("controller")):
        env = re.search(r"\[env: ([A-Z0-9_]+)=", block)
        if env:
            default = re.search(r"\[default: ([^\]]*)\]", block)
            out[env.group(1)] = default.group(1).strip('"') if default else None
    assert blocks
    return out


def test_every_setting_the_readme_names_is_read_with_the_stated_default() -> None:
    named = settings_named()
    assert "BATCH_IDLE_DURATION" in named and named["BATCH_IDLE_DURATION"] == "1s", named
    env = controller_env()
    # Named in the paragraph but not the controller's own settings.
    not_settings = {"KUBECONFIG"}
    for name, default in named.items():
        if name in not_settings:
            continue
        assert name in env, f"README names {name}, which `karpenter controller` does not read"
        if default is not None:
            assert env[name] == default, f"{name}: README says {default}, the binary {env[name]}"
