#!/usr/bin/env bash
# Check rhino on this machine's own jax: a GPU machine's preinstalled jax and CUDA plugin
# (or, with the same flags, a machine with none, on its CPU). Never installs or changes
# jax, jaxlib, their plugins or anything else already installed: it adds rhino and the
# packages it needs that are missing to the environment of $PYTHON (default python3),
# pinned against what is there, then runs scripts/gpu_check.py (see there for the checks).
#
#   bash scripts/gpu_check.sh                                # GPU: plan, run, 1-stage pipeline
#   bash scripts/gpu_check.sh --out check.json               # also the results as JSON
#   RHINO_WHEELS=/path/to/wheels bash scripts/gpu_check.sh   # no network: install from there
#   PYTHON=.venv/bin/python bash scripts/gpu_check.sh --platform cpu --examples mlp
#
# RHINO_WHEELS, for a machine without a package index: a folder of the wheels of rhino's
# dependencies that are missing there (for the GPU image: ortools, highspy, pytoulbar2 and
# theirs), e.g. made elsewhere with `pip download --only-binary=:all: --python-version 3.12
# -d wheels ortools highspy pytoulbar2 ...`.
# Exit codes: those of gpu_check.py (0 ok, 1 a check failed, 2 no device or bad arguments);
# 2 also when rhino cannot be installed next to this jax.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! "$PY" -c "import jax, jaxlib" 2>/dev/null; then
    echo "gpu_check: $PY has no jax; this check runs on a machine's preinstalled jax" >&2
    exit 2
fi
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
# everything installed stays at its version (constraints, not requirements)
"$PY" - >"$pins" <<'PY'
from importlib import metadata
seen = set()
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").strip()
    if name and name.lower() not in seen and name.lower() != "rhino":
        seen.add(name.lower())
        print(f"{name}=={dist.version}")
PY
index=()
if [[ -n "${RHINO_WHEELS:-}" ]]; then index=(--no-index --find-links "$RHINO_WHEELS"); fi
# build rhino with the setuptools already there when there is one (no index needed)
if "$PY" -c "import setuptools, wheel" 2>/dev/null; then index+=(--no-build-isolation); fi
if ! "$PY" -m pip install -q --disable-pip-version-check "${index[@]}" -c "$pins" . >&2; then
    echo "gpu_check: rhino cannot be installed next to the packages of $PY without changing" \
         "them (above: pip's reason); rhino runs on jax 0.10.2 to 0.12.0.1" >&2
    exit 2
fi
exec "$PY" scripts/gpu_check.py "$@"
