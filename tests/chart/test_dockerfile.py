"""The controller image's Dockerfile: hadolint (pinned, hack/hadolint.sh) and
the structure the chart relies on. No container engine is needed;
hack/docker-build-stage.sh proves the builder stage's commands separately.
"""

from __future__ import annotations

import json
import re
import subprocess

from chart_helpers import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends in a line continuation"
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        assert result, "instruction before the first FROM"
        result[-1].append(ins)
    return result


def test_hadolint_passes() -> None:
    proc = subprocess.run(
        [str(REPO_ROOT / "hack" / "hadolint.sh"), str(DOCKERFILE)], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"hadolint found problems:\n{proc.stdout}\n{proc.stderr}"


def test_multi_stage_with_a_rust_builder_and_a_distroless_runtime() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2, "the Dockerfile must be multi-stage"
    builder_from = all_stages[0][0][1]
    assert re.match(r"rust:\d+\.\d+(\.\d+)?-\S+ AS builder$", builder_from), builder_from
    final_from = all_stages[-1][0][1]
    assert final_from.startswith("gcr.io/distroless/cc-"), final_from
    assert final_from.endswith(":nonroot"), final_from


def test_base_images_are_pinned() -> None:
    for keyword, args in instructions():
        if keyword != "FROM":
            continue
        image = args.split()[0]
        assert not image.startswith("$"), f"FROM {image}: name the image so that linters can check it"
        name, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag, f"FROM {image} has no tag"
        assert tag != "latest", f"FROM {image} uses latest"


def test_final_stage_runs_the_binary_as_65532() -> None:
    final = stages()[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users and users[-1] == "65532:65532", users
    entrypoints = [args for keyword, args in final if keyword == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT in the final stage"
    assert json.loads(entrypoints[-1]) == ["/karpenter"], "ENTRYPOINT must be the exec form [\"/karpenter\"]"
    assert not [k for k, _ in final if k in ("RUN", "CMD")], "the runtime stage has no shell to run commands with"
    assert ("COPY", "--from=builder /karpenter /karpenter") in final


def test_builder_runs_the_commands_ci_checks() -> None:
    runs = " ".join(args for keyword, args in stages()[0] if keyword == "RUN")
    assert "cargo build --release --locked --bin karpenter" in runs
    script = (REPO_ROOT / "hack" / "docker-build-stage.sh").read_text()
    assert "cargo build --release --locked --bin karpenter" in script
    # A dependency-only layer comes before the sources are copied.
    copies = [args for keyword, args in stages()[0] if keyword == "COPY"]
    assert copies[0].split()[:-1] == ["Cargo.toml", "Cargo.lock"], copies
    assert copies[1].startswith("src"), copies


def test_dockerignore_lets_in_only_the_build_inputs() -> None:
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "the build context starts from nothing"
    assert set(lines[1:]) == {"!Cargo.toml", "!Cargo.lock", "!src/", "!benches/"}
