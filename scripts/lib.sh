# Shared helpers for nixlctl's scripts: sourced, not run.
# Everything here is idempotent: a second run installs nothing.

# System packages nixlctl builds and runs with (Debian 12 names).
# etcd-server: the etcd rendezvous's tests start a real etcd (on ports of
# their own; the service the package may start is not used). iproute2 and
# util-linux (ip, tc, unshare): the two-host test stages hosts with
# namespaces; jq and bc: scripts/multihost-bench.sh; chromium: the HTML
# report's browser test (internal/htmlreport) opens its pages headless.
# slurm-wlm and munge: the Slurm test (cmd/nixlctl TestSlurm) runs
# deploy/slurm's template on a slurmctld, two slurmd and a munged of its
# own (own config, ports, socket; the services the packages may start are
# not used). openmpi-bin: the Open MPI test (TestOpenMPI) starts the
# endpoints with mpirun across the staged hosts.
NIXLCTL_APT_PACKAGES=(build-essential pkg-config git ca-certificates curl unzip make
  libucx-dev ucx-utils libzmq3-dev etcd-server iproute2 util-linux jq bc chromium
  slurm-wlm munge openmpi-bin)
# The Go toolchain go.mod asks for, fetched from the Go module proxy when
# the machine has no Go that new.
NIXLCTL_GO_VERSION=1.26.0

log() { printf '==> %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; return 1; fi
}

install_system_packages() {
  local missing=()
  for p in "${NIXLCTL_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  log "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# go_ok PATH: true if PATH is a go binary at least NIXLCTL_GO_VERSION, or
# one new enough (>= 1.21) to fetch that toolchain itself from the proxy.
go_ok() {
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n%s\n' "1.21" "$v" | sort -V | head -1)" = "1.21" ]
}

ensure_go() {
  export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
  if command -v go >/dev/null && go_ok "$(command -v go)"; then return 0; fi
  local dir=/usr/local/go-$NIXLCTL_GO_VERSION
  if [ ! -x "$dir/bin/go" ]; then
    local mod="golang.org/toolchain/@v/v0.0.1-go${NIXLCTL_GO_VERSION}.linux-amd64.zip"
    local proxy=${GOPROXY:-https://proxy.golang.org}; proxy=${proxy%%,*}
    log "fetching Go $NIXLCTL_GO_VERSION from $proxy"
    local tmp; tmp=$(mktemp -d)
    curl -fsSL "$proxy/$mod" -o "$tmp/go.zip"
    (cd "$tmp" && unzip -q go.zip)
    as_root mv "$tmp/golang.org/toolchain@v0.0.1-go${NIXLCTL_GO_VERSION}.linux-amd64" "$dir"
    as_root chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
    rm -rf "$tmp"
  fi
  export PATH="$dir/bin:$PATH"
}

build_nixlctl() {
  log "building bin/nixlctl"
  go build -o bin/nixlctl ./cmd/nixlctl
}
