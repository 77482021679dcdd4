#!/usr/bin/env bash
# Build the local Kubernetes control plane once into a versioned cache, from the Go module proxy:
# kube-apiserver, kube-scheduler, kube-controller-manager (v1.34.4), etcd (v3.6.16) and kwok (v0.7.0).
# A second run only checks. Cold, on 2 cores, this takes most of an hour (kube-apiserver alone ~30 min);
# the binaries land in $(bash build.sh --print-dir) and are reused by every later run on the machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
KUBERNETES_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.7.0
cache_home="${XDG_CACHE_HOME:-$HOME/.cache}"
bin_dir="$cache_home/orchard/kubernetes-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}/bin"
if [ "${1:-}" = "--print-dir" ]; then echo "$bin_dir"; exit 0; fi
stages_dir="$bin_dir/../kwok-stages"   # kwok's own fast pod stages, beside which cluster.py adds its test stages
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd kwok)
missing=()
for name in "${binaries[@]}"; do [ -x "$bin_dir/$name" ] || missing+=("$name"); done
[ -f "$stages_dir/pod-ready.yaml" ] || missing+=(kwok-stages)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v go >/dev/null 2>&1; then
  echo "kubernetes build: installing Go (golang-go)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
fi
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[ "$go_minor" -ge 24 ] || { echo "kubernetes build: needs Go >= 1.24, found $(go env GOVERSION)" >&2; exit 1; }
mkdir -p "$bin_dir"
exec 9>"$bin_dir/../.build.lock"
flock 9
# Stripped binaries link faster and are a third smaller; nothing here is debugged with a debugger.
flags=(-trimpath -ldflags=-s\ -w)
stage="$bin_dir/../stage"
mkdir -p "$stage"
started=$(date +%s)
note() { echo "kubernetes build: $* ($(( $(date +%s) - started )) s)" >&2; }
if [ ! -x "$bin_dir/kwok" ]; then
  note "kwok $KWOK_VERSION"
  GOBIN="$stage" go install "${flags[@]}" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$stage/kwok" "$bin_dir/kwok"
fi
if [ ! -x "$bin_dir/etcd" ]; then
  note "etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build "${flags[@]}" -o "$stage/etcd" .)
  mv "$stage/etcd" "$bin_dir/etcd"
fi
for name in kube-apiserver kube-scheduler kube-controller-manager; do
  if [ ! -x "$bin_dir/$name" ]; then
    note "$name $KUBERNETES_VERSION"
    (cd "$here/control-plane" && go build "${flags[@]}" -o "$stage/$name" "k8s.io/kubernetes/cmd/$name")
    mv "$stage/$name" "$bin_dir/$name"
  fi
done
if [ ! -f "$stages_dir/pod-ready.yaml" ]; then
  kwok_src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"
  [ -d "$kwok_src" ] || (cd "$here/etcd" && go mod download "sigs.k8s.io/kwok@$KWOK_VERSION")
  mkdir -p "$stages_dir.tmp"
  cp "$kwok_src"/kustomize/stage/pod/fast/pod-{ready,complete,delete}.yaml "$stages_dir.tmp/"
  mv "$stages_dir.tmp" "$stages_dir"
fi
rmdir "$stage" 2>/dev/null || true
note "done: $bin_dir"
