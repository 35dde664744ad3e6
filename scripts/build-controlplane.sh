#!/usr/bin/env bash
# Build the real control plane that `heterotrain cluster up` and tests/cluster run, from the Go
# modules pinned in tests/controlplane/go.mod (Kubernetes + etcd) and tests/controlplane/kueue/go.mod
# (Kueue's manager), into a cache keyed by those files' hash:
#   ${HETEROTRAIN_CACHE_DIR:-~/.cache/heterotrain}/controlplane/<hash>/bin/
# Prints that bin dir on its last line (progress goes to stderr). A second run with the same pins
# finds every binary and returns in well under a second. Fails (exit 1) if any binary cannot be built.
#   bash scripts/build-controlplane.sh            # all: kube-apiserver kube-controller-manager
#                                                  #      kube-scheduler kubectl etcd kueue
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cp_dir=$root/tests/controlplane
command -v go >/dev/null || { echo "build-controlplane: go not found (Go >= 1.25 needed)" >&2; exit 1; }

hash=$(cat "$cp_dir/go.mod" "$cp_dir/go.sum" "$cp_dir/kueue/go.mod" "$cp_dir/kueue/go.sum" \
       | sha256sum | cut -c1-16)
cache=${HETEROTRAIN_CACHE_DIR:-$HOME/.cache/heterotrain}
out=$cache/controlplane/$hash
bin=$out/bin
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kueue)

have_all() {
  local b
  for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done
}
if have_all; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
log=$out/build.log
: >"$log"
# -mod=mod: the go.sum files are committed; the proxy serves the modules. Default parallelism.
export GOFLAGS=-mod=mod
kver=$(sed -n 's/^\tk8s.io\/kubernetes v\([0-9.]*\)$/\1/p' "$cp_dir/go.mod" | head -1)
[ -n "$kver" ] || kver=$(sed -n 's/.*k8s.io\/kubernetes v\([0-9.]*\).*/\1/p' "$cp_dir/go.mod" | head -1)
major=${kver%%.*}; minor=${kver#*.}; minor=${minor%%.*}
kueue_ver=$(sed -n 's/.*sigs.k8s.io\/kueue \(v[0-9.]*\).*/\1/p' "$cp_dir/kueue/go.mod" | head -1)
ldk=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldk+=" -X $pkg.gitVersion=v$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldk+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() {  # build NAME MODULE_DIR PACKAGE LDFLAGS
  local name=$1 dir=$2 pkg=$3 ld=$4 t0
  [ -x "$bin/$name" ] && return 0
  t0=$(date +%s)
  echo "build-controlplane: building $name ($pkg) ..." >&2
  if ! (cd "$dir" && go build -trimpath -ldflags "-s -w $ld" -o "$bin/$name.tmp" "$pkg") >>"$log" 2>&1; then
    rm -f "$bin/$name.tmp"
    echo "build-controlplane: FAILED to build $name; last lines of $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  mv "$bin/$name.tmp" "$bin/$name"
  echo "build-controlplane: $name built in $(( $(date +%s) - t0 )) s" >&2
}

t_all=$(date +%s)
build kube-apiserver "$cp_dir" k8s.io/kubernetes/cmd/kube-apiserver "$ldk"
build kube-controller-manager "$cp_dir" k8s.io/kubernetes/cmd/kube-controller-manager "$ldk"
build kube-scheduler "$cp_dir" k8s.io/kubernetes/cmd/kube-scheduler "$ldk"
build kubectl "$cp_dir" k8s.io/kubernetes/cmd/kubectl "$ldk"
build etcd "$cp_dir" go.etcd.io/etcd/server/v3 ""
build kueue "$cp_dir/kueue" sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_ver"
have_all || { echo "build-controlplane: a binary is missing from $bin" >&2; exit 1; }
echo "build-controlplane: all built in $(( $(date +%s) - t_all )) s" >&2
echo "$bin"
