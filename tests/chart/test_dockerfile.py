"""The controller image's Dockerfile: hadolint (pinned, hack/hadolint.sh), the
structure the chart relies on, and the runner that executes the builder stage's
own instructions without a container engine (hack/dockerfile_stage.py; `make
test` runs it on the real Dockerfile through hack/docker-build-stage.sh).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chart_helpers import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


sys.path.insert(0, str(REPO_ROOT / "hack"))
import dockerfile_stage  # noqa: E402  (the runner CI uses; its parser is the one read here)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    return [(i.keyword, i.args) for i in dockerfile_stage.parse(DOCKERFILE.read_text())]


def stages() -> list[list[tuple[str, str]]]:
    return [[(i.keyword, i.args) for i in body] for _, body in dockerfile_stage.stages(dockerfile_stage.parse(DOCKERFILE.read_text()))]


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
    assert ("COPY", "--from=builder /src/target/release/karpenter /karpenter") in final


def test_builder_builds_the_release_binary_with_a_dependency_layer_first() -> None:
    runs = " ".join(args for keyword, args in stages()[0] if keyword == "RUN")
    assert "cargo build --release --locked --bin karpenter" in runs
    # A dependency-only layer comes before the sources are copied.
    copies = [args for keyword, args in stages()[0] if keyword == "COPY"]
    assert copies[0].split()[:-1] == ["Cargo.toml", "Cargo.lock"], copies
    # The build settings (the allocator's configuration) come with the manifests, so that the
    # dependency layer builds jemalloc as `cargo build` does outside the image.
    assert copies[1].split() == [".cargo", "./.cargo"], copies
    assert copies[2].startswith("src"), copies
    # CI runs exactly these instructions: hack/docker-build-stage.sh holds no build command.
    script = (REPO_ROOT / "hack" / "docker-build-stage.sh").read_text()
    assert "cargo build" not in script


def test_the_builder_stage_is_one_the_runner_can_prove() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "dockerfile_stage.py"), "--check-only"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_dependency_layer_stubs_every_declared_target(tmp_path: Path) -> None:
    """The first RUN of the builder, on the real Cargo.toml, leaves a stub for every target
    (a [[bench]] Cargo.toml declares without a file makes cargo refuse the manifest)."""
    first_run = next(args for keyword, args in stages()[0] if keyword == "RUN")
    # Everything before the build itself, in the stage's shell.
    stub = first_run.split("&& cargo build")[0]
    shutil.copy(REPO_ROOT / "Cargo.toml", tmp_path / "Cargo.toml")
    subprocess.run(["/bin/bash", "-o", "pipefail", "-c", stub], cwd=tmp_path, check=True)
    manifest = (REPO_ROOT / "Cargo.toml").read_text()
    benches = re.findall(r'\[\[bench\]\]\s*\nname\s*=\s*"([^"]+)"', manifest)
    assert benches, "Cargo.toml declares benches"
    for bench in benches:
        assert (tmp_path / "benches" / f"{bench}.rs").exists(), bench
    assert (tmp_path / "src" / "main.rs").exists() and (tmp_path / "src" / "lib.rs").exists()


def run_stage(dockerfile: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    return subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "hack" / "dockerfile_stage.py"),
            "--dockerfile",
            str(path),
            "--workdir",
            str(tmp_path / "work"),
            *extra,
        ],
        capture_output=True,
        text=True,
    )


def test_the_runner_copies_the_context_and_runs_the_stage(tmp_path: Path) -> None:
    proc = run_stage(
        "FROM rust:1.95-bookworm AS builder\n"
        "WORKDIR /src\n"
        "COPY Cargo.toml Cargo.lock ./\n"
        "COPY src ./code\n"
        "ENV GREETING=hello\n"
        "RUN test -f Cargo.lock && test -f code/main.rs && test ! -e code/src \\\n"
        "    && mkdir -p out && echo \"$GREETING $EXTRA\" > out/made\n"
        "FROM gcr.io/distroless/cc-debian12:nonroot\n"
        "COPY --from=builder /src/out/made /made\n",
        tmp_path,
        "--env",
        "EXTRA=world",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "work" / "out" / "made").read_text() == "hello world\n"
    # .dockerignore keeps the rest of the repository out of the context.
    assert not (tmp_path / "work" / "README.md").exists()


@pytest.mark.parametrize(
    ("dockerfile", "error"),
    [
        (
            "FROM rust:1.95-bookworm AS builder\nWORKDIR /src\nRUN true\nFROM scratch\nCOPY --from=builder /out /out\n",
            "/out is outside the stage's WORKDIR /src",
        ),
        ("FROM rust:1.95-bookworm AS builder\nWORKDIR /src\nADD x y\n", "ADD is not supported"),
        ("FROM rust:1.95-bookworm AS builder\nRUN true\n", "sets no WORKDIR"),
        ("FROM rust:1.95-bookworm AS builder\nWORKDIR /src\nCOPY nothing-here ./\n", "is not in the build context"),
        ("FROM rust:1.95-bookworm AS builder\nWORKDIR /src\nRUN exit 3\n", "exited with 3"),
        (
            "FROM rust:1.95-bookworm AS builder\nWORKDIR /src\nRUN true\nFROM scratch\nCOPY --from=builder /src/none /x\n",
            "did not make /src/none",
        ),
    ],
)
def test_the_runner_refuses_what_it_cannot_prove(tmp_path: Path, dockerfile: str, error: str) -> None:
    proc = run_stage(dockerfile, tmp_path)
    assert proc.returncode == 1
    assert error in proc.stderr, proc.stderr


def test_dockerignore_lets_in_only_the_build_inputs() -> None:
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "the build context starts from nothing"
    assert set(lines[1:]) == {"!Cargo.toml", "!Cargo.lock", "!.cargo/", "!src/", "!benches/"}
