#!/usr/bin/env bash
# Installs what kettle needs to build and test on Debian 12, from Debian's
# packages only. Idempotent: skips apt when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
  libgtest-dev libpcre2-dev libicu-dev libsqlite3-dev libcurl4-openssl-dev
  chromium  # the browser test of the chat page (tests/browser/)
  clang libclang-rt-14-dev  # libFuzzer for the request-parser fuzz pass (tests/fuzz/)
)
# The end-to-end tests run under Node's test runner; a machine that already has a
# node and npm (from any source) keeps them, a bare Debian gets Debian's.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
