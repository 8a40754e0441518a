#!/usr/bin/env bash
# Make sure Chromium is there for the real-browser tests (tests/browser/): install Debian's package with
# apt-get when we are root on Debian/Ubuntu, otherwise print the command to run. Without Chromium those
# tests skip, except under CI=true, where this step (and the tests) fail instead.
set -euo pipefail
CHROMIUM="${BT_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$CHROMIUM" = /usr/bin/chromium ]; then
  echo "Installing Chromium with apt-get for the browser tests..."
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
    [ -x "$CHROMIUM" ] && exit 0
  fi
fi
cat >&2 <<MSG
The browser tests (tests/browser/) drive JupyterLab in Chromium, expected at $CHROMIUM, which is not installed.
Install it, then run make again:
  Debian/Ubuntu:  sudo apt-get install -y chromium
Without it those tests are skipped (run the others alone with PYTEST_ARGS="-m 'not browser'").
MSG
if [ "${CI:-}" = true ]; then
  echo "CI=true: a missing browser is an error." >&2
  exit 1
fi
exit 0
