#!/usr/bin/env bash
# Make sure Graphviz's `dot` is on PATH: install it with apt-get when we are root on Debian/Ubuntu,
# otherwise stop with the command to run.
set -euo pipefail
if command -v dot >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Graphviz (dot) with apt-get..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null
  command -v dot >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
Graphviz's `dot` program is needed to draw autograd graphs, and it is not installed.
Install it, then run make again:
  Debian/Ubuntu:     sudo apt-get install -y graphviz
  macOS (Homebrew):  brew install graphviz
  conda:             conda install -c conda-forge graphviz
MSG
exit 1
