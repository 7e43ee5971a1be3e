#!/usr/bin/env bash
# Builds what a GPU machine without Go, UCX or libzmq needs to run
# scripts/gpu-check.sh, into one git-ignored folder:
#
#   DIR/bin/nixlctl        the CLI (stripped)
#   DIR/bin/ucx_info       for `probe env`, with UCX's transport modules in lib/ucx
#   DIR/tests/*.test       `go test -c` binaries of the GPU packages, and
#   DIR/tests/PACKAGES     which package directory each one runs in
#   DIR/lib/               every shared library those load (ldd, followed
#                          transitively, UCX's dlopened modules included) except
#                          glibc's own, which every Linux has; the C++ runtime
#                          in lib/gcc-runtime, for machines without one
#   DIR/MANIFEST           versions, commit, sizes
#
# Nothing in it links CUDA: nixlctl dlopens the driver the GPU machine has.
# gpu-check.sh puts DIR/lib on the loader path of nixlctl's commands only
# (never of nvidia-smi or python, which must keep the machine's own libraries).
#
#   scripts/gpu-bundle.sh [DIR]          default DIR: .device/gpu
#   PACK=1 scripts/gpu-bundle.sh [DIR]   also DIR.tar.xz, small enough to carry
#                                        (xz -9: ~16 MiB for ~120 MiB of binaries)
#   CHECK=1 scripts/gpu-bundle.sh [DIR]  then prove it self-contained (see
#                                        check_bundle: a chroot holding only
#                                        glibc and DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device/gpu}
PACK=${PACK:-0}
CHECK=${CHECK:-0}

# The packages with GPU code or GPU tests, and the directory each test
# binary must run in (testdata is read relative to it).
GPU_PACKAGES=(
  internal/nixl/cuda
  internal/nixl/cudaipc
  internal/nixl/nixltest
  internal/blocktag
  internal/engine
  internal/xferbench
  internal/probe
  cmd/nixlctl
)

log() { printf '==> %s\n' "$*" >&2; }

# glibc's libraries: present on any Linux the binaries can run on, and
# tied to its loader, so they are never carried.
is_glibc() {
  case $1 in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*) return 0 ;;
  esac
  return 1
}

build() {
  rm -rf "$DIR"
  mkdir -p "$DIR/bin" "$DIR/tests" "$DIR/lib"
  local version
  version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
  log "building nixlctl $version"
  go build -ldflags "-s -w -X main.version=$version" -o "$DIR/bin/nixlctl" ./cmd/nixlctl
  : >"$DIR/tests/PACKAGES"
  for p in "${GPU_PACKAGES[@]}"; do
    local name
    name=$(echo "$p" | tr / _).test
    log "go test -c ./$p"
    go test -c -ldflags "-s -w" -o "$DIR/tests/$name" "./$p"
    printf '%s %s\n' "$name" "$p" >>"$DIR/tests/PACKAGES"
  done
  if command -v ucx_info >/dev/null; then
    cp "$(command -v ucx_info)" "$DIR/bin/"
  fi
  # UCX finds its transport modules in ucx/ beside libucs, wherever that is.
  local ucs moddir
  ucs=$(ldd "$DIR/bin/nixlctl" | awk '$1 == "libucs.so.0" {print $3}')
  moddir=$(dirname "$(readlink -f "$ucs")")/ucx
  if [ -d "$moddir" ]; then
    mkdir -p "$DIR/lib/ucx"
    cp -L "$moddir"/*.so.0 "$DIR/lib/ucx/"
  fi
  collect_libs
  # The C++ runtime apart: gpu-check.sh uses it only where the machine has
  # none, as libraries built there need the machine's (newer) one.
  mkdir -p "$DIR/lib/gcc-runtime"
  for l in libstdc++.so.6 libgcc_s.so.1; do
    [ -e "$DIR/lib/$l" ] && mv "$DIR/lib/$l" "$DIR/lib/gcc-runtime/"
  done
  manifest "$version"
}

# Copies the libraries every ELF file of the bundle needs, following
# dependencies until nothing new appears (ldd already resolves the whole
# tree of one file; the modules in lib/ucx add their own).
collect_libs() {
  local f lib path n=0
  local files
  mapfile -t files < <(find "$DIR/bin" "$DIR/tests" "$DIR/lib/ucx" -type f 2>/dev/null | sort)
  for f in "${files[@]}"; do
    [ "$(head -c4 "$f" | tr -d '\177')" = ELF ] || continue
    while read -r lib path; do
      is_glibc "$lib" && continue
      [ -e "$DIR/lib/$lib" ] && continue
      [ -n "$path" ] && [ -e "$path" ] || { log "$f needs $lib, which is not installed"; return 1; }
      cp -L "$path" "$DIR/lib/$lib"
      n=$((n + 1))
    done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" {print $1, $3} $2 != "=>" && $1 !~ /^\// {print $1, ""}' | grep -v '^linux-vdso')
  done
  log "carried $n shared libraries"
}

manifest() {
  {
    echo "nixlctl bundle for a GPU machine (scripts/gpu-bundle.sh)"
    echo "version: $1"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(go version)"
    echo "glibc needed (not carried): $(ldd --version | head -1 | awk '{print $NF}') or newer"
    echo "ucx: $(ucx_info -v 2>/dev/null | awk '/Library version/ {print $NF}')"
    echo "size: $(du -sh "$DIR" | cut -f1) ($(du -sb "$DIR" | cut -f1) bytes)"
    echo
    echo "files:"
    (cd "$DIR" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
  } >"$DIR/MANIFEST"
}

# Proves the bundle needs nothing but glibc: a chroot holding only glibc's
# libraries and the bundle runs nixlctl, ucx_info, a UCX transfer between
# two processes and a test binary. Needs root (chroot, mounts).
check_bundle() {
  local root
  root=$(mktemp -d /tmp/nixlctl-bundle-check.XXXXXX)
  trap 'umount -R "$root/proc" "$root/sys" "$root/dev" 2>/dev/null || true; rm -rf "$root"' RETURN
  mkdir -p "$root/lib64" "$root/lib/x86_64-linux-gnu" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/b"
  chmod 1777 "$root/tmp"
  local l
  for l in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/{libc,libm,libpthread,libdl,librt,libresolv}.so.*; do
    [ -e "$l" ] && cp -L "$l" "$root$l"
  done
  cp -a "$DIR/." "$root/b/"
  log "check: the bundle in a chroot with glibc alone ($(du -sh "$root" | cut -f1))"
  unshare -m sh -c "mount -t proc proc '$root/proc' && mount -t sysfs sys '$root/sys' && mount --rbind /dev '$root/dev' && \
    LD_LIBRARY_PATH=/b/lib:/b/lib/gcc-runtime chroot '$root' /b/bin/nixlctl version && \
    LD_LIBRARY_PATH=/b/lib:/b/lib/gcc-runtime chroot '$root' /b/bin/ucx_info -v | head -2 && \
    cd / && HOME=/tmp LD_LIBRARY_PATH=/b/lib:/b/lib/gcc-runtime chroot '$root' /b/bin/nixlctl bench xfer --backend ucx \
      --start-block-size 64K --max-block-size 64K --num-iter 20 --warmup-iter 2 --check-consistency -o csv && \
    HOME=/tmp NIXLCTL_TEST_CUDA=off LD_LIBRARY_PATH=/b/lib:/b/lib/gcc-runtime chroot '$root' /b/tests/internal_blocktag.test -test.count=1 -test.run 'TestSpanTags' -test.v" \
    || { log "check failed: the bundle is not self-contained"; return 1; }
  log "check passed: nothing outside the bundle but glibc was needed"
}

build
if [ "$CHECK" = 1 ]; then check_bundle; fi
if [ "$PACK" = 1 ]; then
  log "packing $DIR.tar.xz"
  tar -C "$(dirname "$DIR")" -cf - "$(basename "$DIR")" | xz -T0 -9 >"$DIR.tar.xz"
  echo "$DIR.tar.xz: $(du -h "$DIR.tar.xz" | cut -f1)" >&2
fi
echo "bundle: $DIR ($(du -sh "$DIR" | cut -f1))"
