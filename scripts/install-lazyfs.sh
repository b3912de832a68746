#!/usr/bin/env bash
# Builds LazyFS (a FUSE file system that keeps writes in its own cache until fsync and drops
# everything unsynced on `lazyfs::clear-cache`) for the power-loss test, from the vendored
# source in vendor/lazyfs (a copy of ../shared/vendor/lazyfs, MIT, kept in the repository so a
# fresh clone builds it wherever it is checked out; offline; its build.sh installs the Debian packages it
# needs: g++, cmake, fuse3, libfuse3-dev, libtoml11-dev, libspdlog-dev). About a minute the
# first time; a no-op when the binary is already built. Prints the binary's path.
#
#   bash scripts/install-lazyfs.sh          # → ~/.cache/tally/lazyfs/lazyfs/build/lazyfs
#
# Running it needs root (FUSE mounts) and /dev/fuse, as on CI.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${TALLY_LAZYFS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tally/lazyfs}"
bin="$out/lazyfs/build/lazyfs"
if [ -x "$bin" ] && command -v fusermount3 >/dev/null; then
  echo "$bin"
  exit 0
fi
vendor=""
for d in vendor/lazyfs ../shared/vendor/lazyfs; do
  if [ -f "$d/build.sh" ]; then vendor="$(cd "$d" && pwd)"; break; fi
done
if [ -z "$vendor" ]; then
  echo "install-lazyfs: the vendored LazyFS (vendor/lazyfs) is not there" >&2
  exit 1
fi
# A partial earlier build would make build.sh's copy fail: start clean.
rm -rf "$out"
bash "$vendor/build.sh" "$out" >/dev/null
if ! command -v fusermount3 >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq fuse3 >&2
fi
[ -x "$bin" ] || { echo "install-lazyfs: the build made no $bin" >&2; exit 1; }
echo "$bin"
