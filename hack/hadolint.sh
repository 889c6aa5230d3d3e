#!/usr/bin/env bash
# Lints Dockerfiles with the pinned hadolint (hack/hadolint/requirements.txt),
# installed once into a venv of its own under the karpenter-rs cache.
#
#   hack/hadolint.sh [Dockerfile...]   lint (default: ./Dockerfile)
#   hack/hadolint.sh --path            only install, and print the hadolint path
#
# Environment: PYTHON (default python3), KARPENTER_RS_HOME (default ~/.cache/karpenter-rs).
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)
KRS_HOME=${KRS_HOME:-${KARPENTER_RS_HOME:-$HOME/.cache/karpenter-rs}}
REQUIREMENTS=$HACK_DIR/hadolint/requirements.txt
CONFIG=$HACK_DIR/hadolint/config.yaml

# The venv is keyed on the requirements file, so a new pin gets a new venv.
key=$(sha256sum "$REQUIREMENTS" | cut -c1-12)
VENV=$KRS_HOME/venv-hadolint-$key
HADOLINT=$VENV/bin/hadolint

if [[ ! -f "$VENV/.installed" ]]; then
  echo "installing hadolint into $VENV" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --require-hashes -r "$REQUIREMENTS" >&2
  touch "$VENV/.installed"
fi
"$HADOLINT" --version >/dev/null

if [[ "${1:-}" == "--path" ]]; then
  echo "$HADOLINT"
  exit 0
fi

if [[ $# -eq 0 ]]; then
  set -- "$REPO_ROOT/Dockerfile"
fi
exec "$HADOLINT" --no-color --config "$CONFIG" "$@"
