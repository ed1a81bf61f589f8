#!/usr/bin/env bash
# The Debian packages the test suite runs (`make test` calls this first; so does .ci/run):
#   redis-server  tests/test_serve.py's shared-cache tests start a real one;
#   chromium      tests/test_version_page.py plays the version page's audio in a headless browser, and
#                 tests/test_audio_conformance.py decodes the server's audio with Web Audio;
#   ffmpeg        the conformance suite's other decoder.
# Installs only what is missing, quietly (as root, or through passwordless sudo); a machine
# without apt-get, or where the install fails, gets one warning line and the tests skip as before.
set -uo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || command -v google-chrome >/dev/null 2>&1 || missing+=(chromium)
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "warning: no apt-get: install ${missing[*]} yourself, or the tests that need them are skipped" >&2
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    echo "warning: not root and no passwordless sudo: apt-get install ${missing[*]}, or the tests that need them are skipped" >&2
    exit 0
  fi
fi
echo "installing test dependencies: ${missing[*]}" >&2
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1; then
  echo "warning: apt-get could not install ${missing[*]}; the tests that need them are skipped" >&2
fi
exit 0
