#!/usr/bin/env python3
"""Runs one stage of the Dockerfile without a container engine, as the Dockerfile states it.

    hack/dockerfile_stage.py [--dockerfile Dockerfile] [--stage builder] [--workdir DIR]
                             [--env NAME=VALUE ...] [--check-only]

No instruction is copied into this script: it reads the Dockerfile, so what CI proves and what
`docker build` runs cannot drift apart. For the stage named by `--stage` (`FROM ... AS <stage>`):

* the build context is the repository filtered by `.dockerignore` (Docker's rules: patterns in
  order, the last match wins, `!` re-includes, a pattern matching a directory covers what is
  below it);
* `WORKDIR /abs` becomes `--workdir` (wiped at the start, except its `target/` directory, which
  is kept between runs so that dependencies built once are reused);
* `COPY src... dest` copies from the context (a directory's contents, as Docker does), `ENV`
  and `ARG` (with a default) set the environment, `RUN` runs its command with `/bin/sh -c` (the
  exec form as given) in the working directory;
* any other instruction in the stage (or `COPY --from`, `ADD`, `RUN --mount`) is an error: the
  stage must stay within what this runner can prove;
* afterwards, every `COPY --from=<stage> <path>` of the later stages must name a file the stage
  made under its WORKDIR (the builder must not write outside it).

`--env` adds variables to every `RUN` (CI uses it to make the release profile cheap; the
commands stay the Dockerfile's). `--check-only` parses and checks without running anything.
Exit status: 0 when every step succeeded, 1 otherwise, with the failing instruction named.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

REPO_ROOT = Path(__file__).resolve().parent.parent


class StageError(Exception):
    """A Dockerfile this runner cannot run, or a step that failed."""


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.keyword} {self.args}"


def parse(text: str) -> list[Instruction]:
    """The instructions, continuation lines joined, comments and blank lines dropped."""
    out: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    if pending:
        raise StageError("the Dockerfile ends in a line continuation")
    return out


def stages(instructions: list[Instruction]) -> list[tuple[str, list[Instruction]]]:
    """(name, instructions) per stage; a stage without `AS name` is named by its index."""
    result: list[tuple[str, list[Instruction]]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(result))
            result.append((name, [ins]))
        elif not result:
            if ins.keyword != "ARG":
                raise StageError(f"{ins}: instruction before the first FROM")
        else:
            result[-1][1].append(ins)
    return result


def ignore_patterns(path: Path) -> list[tuple[bool, str]]:
    """(excludes, pattern) of a .dockerignore, in order."""
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = str(PurePosixPath(pattern)).lstrip("/")
        out.append((not negate, pattern))
    return out


def excluded(rel: str, patterns: list[tuple[bool, str]]) -> bool:
    """Whether the context path `rel` is left out, by Docker's rules."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for excludes, pattern in patterns:
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            verdict = excludes
    return verdict


def build_context(root: Path) -> dict[str, Path]:
    """Every file of the context: its path in the context -> where it is."""
    patterns = ignore_patterns(root / ".dockerignore")
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not excluded(rel, patterns):
                files[rel] = Path(dirpath) / name
    return files


def inside(workdir: Path, container_path: str, container_workdir: str) -> Path:
    """Where `container_path` (absolute, or relative to the container's working directory) is in
    `workdir`; an error when it is outside the stage's WORKDIR."""
    pure = PurePosixPath(container_path)
    if not pure.is_absolute():
        pure = PurePosixPath(container_workdir) / pure
    try:
        rel = pure.relative_to(container_workdir)
    except ValueError as error:
        raise StageError(f"{container_path} is outside the stage's WORKDIR {container_workdir}") from error
    return workdir / rel


def copy(ins: Instruction, context: dict[str, Path], workdir: Path, container_workdir: str) -> None:
    """COPY as Docker does it: a directory's contents go into the destination; files go into it
    when it ends in `/` or there are several sources, else become it."""
    words = shlex.split(ins.args)
    if any(w.startswith("--") for w in words):
        raise StageError(f"{ins}: COPY flags are not supported here")
    if len(words) < 2:
        raise StageError(f"{ins}: COPY needs a source and a destination")
    *sources, dest = words
    target = inside(workdir, dest, container_workdir)
    into = len(sources) > 1 or dest.endswith("/")
    placed: dict[Path, Path] = {}
    for source in sources:
        prefix = str(PurePosixPath(source)).lstrip("/")
        below = {rel: path for rel, path in context.items() if rel.startswith(prefix + "/")}
        if below:
            for rel, path in below.items():
                placed[target / rel[len(prefix) + 1 :]] = path
            continue
        matched = {rel: path for rel, path in context.items() if fnmatch.fnmatchcase(rel, prefix)}
        if not matched:
            raise StageError(f"{ins}: {source} is not in the build context (see .dockerignore)")
        for rel, path in matched.items():
            placed[target / Path(rel).name if into or len(matched) > 1 else target] = path
    for out, path in sorted(placed.items()):
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, out)
    print(f"    copied {len(placed)} file(s)", flush=True)


def env_assignments(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if len(words) == 2 and "=" not in words[0]:
        return {words[0]: words[1]}  # the legacy `ENV NAME value` form
    out = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep:
            raise StageError(f"cannot read {word!r} as NAME=value")
        out[name] = value
    return out


def run_stage(dockerfile: Path, stage: str, workdir: Path, extra_env: dict[str, str], check_only: bool) -> None:
    all_stages = stages(parse(dockerfile.read_text()))
    names = [name for name, _ in all_stages]
    if stage not in names:
        raise StageError(f"no stage named {stage!r} (stages: {', '.join(names)})")
    index = names.index(stage)
    body = all_stages[index][1][1:]
    container_workdir = "/"
    for ins in body:
        if ins.keyword == "WORKDIR":
            container_workdir = str(PurePosixPath(container_workdir) / ins.args)
        elif ins.keyword == "RUN" and ins.args.startswith("--"):
            raise StageError(f"{ins}: RUN flags are not supported here")
        elif ins.keyword not in ("COPY", "RUN", "ENV", "ARG", "LABEL", "SHELL"):
            raise StageError(f"{ins}: {ins.keyword} is not supported in a stage run without a container engine")
    if container_workdir == "/":
        raise StageError(f"stage {stage} sets no WORKDIR: it would build in the image's root")
    outputs = []
    for _, later in all_stages[index + 1 :]:
        for ins in later:
            if ins.keyword == "COPY" and f"--from={stage}" in ins.args.split():
                sources = [w for w in shlex.split(ins.args) if not w.startswith("--")][:-1]
                outputs.extend((ins, s) for s in sources)
    for ins, source in outputs:
        inside(workdir, source, container_workdir)  # raises when outside WORKDIR
    if check_only:
        print(f"stage {stage}: {len(body)} instruction(s), WORKDIR {container_workdir}, outputs {[s for _, s in outputs]}")
        return

    # A fresh working directory, except the build's target/ (kept for incremental builds).
    workdir.mkdir(parents=True, exist_ok=True)
    for entry in workdir.iterdir():
        if entry.name == "target":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    context = build_context(REPO_ROOT)
    env = dict(os.environ)
    cwd_container = "/"
    shell = ["/bin/sh", "-c"]
    for ins in body:
        started = time.monotonic()
        print(f"==> {ins}", flush=True)
        if ins.keyword == "WORKDIR":
            cwd_container = str(PurePosixPath(cwd_container) / ins.args)
            inside(workdir, cwd_container, container_workdir).mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            copy(ins, context, workdir, container_workdir)
        elif ins.keyword == "SHELL":
            shell = json.loads(ins.args)
        elif ins.keyword == "ENV":
            env.update(env_assignments(ins.args))
        elif ins.keyword == "ARG":
            name, sep, default = ins.args.partition("=")
            if sep and name not in env:
                env[name] = default
        elif ins.keyword == "RUN":
            cwd = inside(workdir, cwd_container, container_workdir)
            command = json.loads(ins.args) if ins.args.startswith("[") else [*shell, ins.args]
            proc = subprocess.run(command, cwd=cwd, env={**env, **extra_env}, check=False)
            if proc.returncode != 0:
                raise StageError(f"{ins}: exited with {proc.returncode}")
        print(f"    ({time.monotonic() - started:.1f}s)", flush=True)
    for ins, source in outputs:
        made = inside(workdir, source, container_workdir)
        if not made.exists():
            raise StageError(f"{ins}: stage {stage} did not make {source}")
        print(f"stage {stage} made {source} ({made.stat().st_size} bytes)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", type=Path, default=REPO_ROOT / "Dockerfile")
    parser.add_argument("--stage", default="builder")
    parser.add_argument("--workdir", type=Path, default=None, help="where the stage's WORKDIR is made")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    home = Path(os.environ.get("KARPENTER_RS_HOME", Path.home() / ".cache" / "karpenter-rs"))
    workdir = args.workdir or home / "image-stage" / args.stage
    extra = {}
    for assignment in args.env:
        name, sep, value = assignment.partition("=")
        if not sep:
            parser.error(f"--env {assignment}: expected NAME=VALUE")
        extra[name] = value
    try:
        run_stage(args.dockerfile, args.stage, workdir, extra, args.check_only)
    except StageError as error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
