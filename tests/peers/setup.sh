#!/usr/bin/env bash
# System packages and compiled peers the test suite needs (idempotent, quick when done).
#
# Builds tests/peers/build/fastdds_peer: a C++ ROS 2 wire peer on Debian's Fast DDS 2.9
# (libfastrtps-dev), used by tests/ros2/test_fastdds_interop.py. Runs from `make setup` as root on
# a fresh Debian machine; re-running it is a no-op when the binary is newer than its sources.
# Without apt (or root), or when the install fails, it warns and exits 0: the tests then skip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/build"
peer="$build/fastdds_peer"
src="$here/fastdds_peer.cpp"
packages=(libfastrtps-dev libfastcdr-dev g++)

warn() { echo "tests/peers/setup.sh: WARNING: $*; Fast DDS interop tests will skip" >&2; }

# 1. Up to date? (newer than its source and this script, and the libraries still there)
if [[ -x "$peer" && "$peer" -nt "$src" && "$peer" -nt "${BASH_SOURCE[0]}" ]]; then
  libs="$(ldd "$peer" 2>/dev/null || true)"
  if [[ "$libs" == *libfastrtps* && "$libs" != *"not found"* ]]; then
    exit 0
  fi
fi

# 2. Packages: apt-get update once, and only when something is missing.
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null 2>&1; then
    warn "apt-get not available to install ${missing[*]}"
    exit 0
  fi
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      warn "not root (and no passwordless sudo) to install ${missing[*]}"
      exit 0
    fi
  fi
  echo "tests/peers/setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! { "${sudo[@]}" apt-get update -qq &&
         "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    warn "apt-get install ${missing[*]} failed"
    exit 0
  fi
fi

# 3. Compile (a plain g++ line: one file, ~7 s). Written to a temporary name, then moved, so a
#    concurrent run or an interrupted build never leaves a half-written binary behind.
mkdir -p "$build"
tmp="$(mktemp "$build/.fastdds_peer.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
g++ -std=c++17 -O1 -Wall -Wextra -o "$tmp" "$src" -lfastrtps -lfastcdr -pthread
chmod 755 "$tmp"
mv -f "$tmp" "$peer"
echo "tests/peers/setup.sh: built $peer"
