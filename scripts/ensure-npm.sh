#!/usr/bin/env bash
# Make sure npm is there for the offline copy (make html), which installs the pinned widget renderer
# from the npm registry, and for the accessibility test, which installs the pinned axe-core the same way:
# install Debian's package with apt-get when we are root on Debian/Ubuntu, otherwise print the command to
# run. Without npm the site tests (tests/test_site.py, tests/browser/test_offline_site.py) and the dark-theme
# and axe tests (tests/browser/test_dark_theme_and_axe.py) skip, except under CI=true, where this step fails.
set -euo pipefail
if command -v npm >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing npm with apt-get for the offline copy (make html)..."
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; then
    command -v npm >/dev/null 2>&1 && exit 0
  fi
fi
cat >&2 <<MSG
The offline copy (make html) and the accessibility test install their pinned packages (the widget
renderer, axe-core) with npm, which is not installed.
Install it, then run make again:
  Debian/Ubuntu:  sudo apt-get install -y npm      macOS:  brew install node
Without it the site tests and the dark-theme and axe tests are skipped.
MSG
if [ "${CI:-}" = true ]; then
  echo "CI=true: a missing npm is an error." >&2
  exit 1
fi
exit 0
