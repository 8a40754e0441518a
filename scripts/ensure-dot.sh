#!/usr/bin/env bash
# Make sure Graphviz's `dot` is on PATH: install it with apt-get when we are root on Debian/Ubuntu,
# otherwise print the command to run and stop.
# With --warn-only (make lab) a missing dot is not an error: the course's own drawings show the install
# commands and a text rendering instead of a picture; only torchviz's drawing in notebook 01 needs dot.
# make test and make execute-notebooks call it without the flag, since their drawings must be pictures.
set -euo pipefail
warn_only=false
case "${1:-}" in
  --warn-only) warn_only=true ;;
  "") ;;
  *) echo "usage: ensure-dot.sh [--warn-only]" >&2; exit 2 ;;
esac
if command -v dot >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Graphviz (dot) with apt-get..."
  # A failed install (no network, another apt running) falls through to the message below.
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; then
    command -v dot >/dev/null 2>&1 && exit 0
  fi
fi
cat >&2 <<'MSG'
Graphviz's `dot` program draws the autograd graphs, and it is not installed. Install it:
  Debian/Ubuntu:     sudo apt-get install -y graphviz
  Fedora:            sudo dnf install graphviz
  macOS (Homebrew):  brew install graphviz
  Windows:           winget install --id Graphviz.Graphviz
  conda:             conda install -c conda-forge graphviz
MSG
if [ "$warn_only" = true ]; then
  cat >&2 <<'MSG'
Going on without it: graph drawings show as text instead of pictures. One cell stops: torchviz's drawing in
notebook 01, section 2; run the cells below it with Run > Run Selected Cell and All Below.
MSG
  exit 0
fi
echo "Then run make again." >&2
exit 1
