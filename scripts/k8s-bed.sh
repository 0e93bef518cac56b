#!/usr/bin/env bash
# Builds the real-node test bed's components from their Go modules (versions: tests/testbed/k8s-versions.env):
#   kubelet, kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes, through a
#                               wrapper module, see build_kubernetes)
#   etcd                        (go.etcd.io/etcd/server/v3, a wrapper calling etcdmain.Main)
#   containerd, ctr, the runc shim (github.com/containerd/containerd/v2, build tag no_btrfs)
#   critest and crictl          (sigs.k8s.io/cri-tools)
#   koord-manager, koord-scheduler (github.com/koordinator-sh/koordinator, built as the main module, with
#                                its CRDs and RBAC role from config/; only when named: "koordinator")
#   koordlet, koord-runtime-proxy (the same module; koordlet with cgo and Debian's libpfm4-dev, installed
#                                when missing; only when named: "koordlet", for the koordlet benchmark)
#   helm                        (helm.sh/helm/v3, for the chart's tests; only when named: "helm")
# Each lands in $KOORDNODE_TESTBED_CACHE (default /var/cache/koordnode-testbed)/<name>-<version>-<go version>/bin,
# built in a scratch directory and moved into place only when complete, so a second run costs
# nothing and an interrupted one leaves no half-built tree. Needs only `go` and the Go module proxy.
#   ./scripts/k8s-bed.sh            build what is missing
#   ./scripts/k8s-bed.sh "etcd containerd"   build only these
#   ./scripts/k8s-bed.sh --print    print NAME=DIR for every component (DIR may not exist yet)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=../tests/testbed/k8s-versions.env
source tests/testbed/k8s-versions.env
CACHE=${KOORDNODE_TESTBED_CACHE:-/var/cache/koordnode-testbed}
export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null 2>&1; then
    echo "k8s-bed: the go command is missing (the test bed builds kubelet, containerd, etcd and cri-tools with it)" >&2
    exit 2
fi
GO_VERSION=$(go env GOVERSION)
# Never fetch another toolchain; static binaries run on the host and in the VM guest alike.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"

dir_of() { echo "$CACHE/$1-$2-$GO_VERSION"; }

if [ "${1:-}" = "--print" ]; then
    echo "kubernetes=$(dir_of kubernetes "$KUBERNETES_VERSION")"
    echo "containerd=$(dir_of containerd "$CONTAINERD_VERSION")"
    echo "etcd=$(dir_of etcd "$ETCD_VERSION")"
    echo "cri-tools=$(dir_of cri-tools "$CRI_TOOLS_VERSION")"
    echo "koordinator=$(dir_of koordinator "$KOORDINATOR_VERSION")"
    echo "koordlet=$(dir_of koordlet "$KOORDINATOR_VERSION")"
    echo "helm=$(dir_of helm "$HELM_VERSION")"
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9   # one build at a time (parallel test runs)

# build NAME VERSION FUNCTION [FILE]: runs FUNCTION in a scratch module dir with $out/bin to fill;
# a cached build without FILE (made before the recipe added it) is built again.
build() {
    local name=$1 version=$2 fn=$3 requires=${4:-} dest work started
    dest=$(dir_of "$name" "$version")
    if [ -f "$dest/.complete" ] && { [ -z "$requires" ] || [ -e "$dest/$requires" ]; }; then return 0; fi
    work=$(mktemp -d "$CACHE/.build-$name-XXXXXX")
    started=$(date +%s)
    echo "k8s-bed: building $name $version with $GO_VERSION (cached in $dest)"
    mkdir -p "$work/out/bin" "$work/src"
    if ! (cd "$work/src" && out="$work/out" "$fn" "$version") >"$work/build.log" 2>&1; then
        echo "k8s-bed: building $name $version failed; the end of its log ($work/build.log):" >&2
        tail -n 40 "$work/build.log" >&2
        exit 1
    fi
    rm -rf "$dest"
    touch "$work/out/.complete"
    mv "$work/out" "$dest"
    rm -rf "$work"
    echo "k8s-bed: $name $version built in $(( $(date +%s) - started )) s"
}

# k8s.io/kubernetes requires its staging modules (k8s.io/api, client-go, kubelet, ...) at v0.0.0
# with replace directives into its own tree, which `go install ...@version` refuses. A wrapper
# module requires k8s.io/kubernetes and replaces each staging module with its published v0.X.Y;
# the list is the release's own go.mod, its "=> ./staging/src/" lines.
build_kubernetes() {
    local version=$1 gomod minor staging
    minor=$(echo "$version" | cut -d. -f2)
    staging="v0.${version#v1.}"
    gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
    [ -f "$gomod" ] || { echo "no go.mod downloaded for k8s.io/kubernetes@$version"; return 1; }
    {
        printf 'module koordnode.local/k8s-bed\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' \
            "$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")" "$version"
        grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$gomod" | awk -v v="$staging" '{print "\t"$1" => "$1" "v}'
        printf ')\n'
    } >go.mod
    printf '//go:build tools\n\npackage k8sbed\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n)\n' >tools.go
    go mod tidy
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
    ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
    go build -trimpath -ldflags "$ldflags" -o "$out/bin/kubelet" k8s.io/kubernetes/cmd/kubelet
    go build -trimpath -ldflags "$ldflags" -o "$out/bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
    # The DaemonSet, ServiceAccount and root CA controllers and the scheduler that binds a
    # DaemonSet's pods, for the chart's pod on a real node.
    go build -trimpath -ldflags "$ldflags" -o "$out/bin/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
    go build -trimpath -ldflags "$ldflags" -o "$out/bin/kube-scheduler" k8s.io/kubernetes/cmd/kube-scheduler
}

build_etcd() {
    local version=$1
    printf 'module koordnode.local/etcd-bed\n\ngo 1.26\n' >go.mod
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >main.go
    go get "go.etcd.io/etcd/server/v3@$version"
    go mod tidy
    go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" .
}

build_containerd() {
    local version=$1 module=github.com/containerd/containerd/v2
    GOBIN="$out/bin" go install -trimpath -tags no_btrfs \
        -ldflags "-s -w -X $module/version.Version=${version#v} -X $module/version.Revision=go-module-proxy" \
        "$module/cmd/containerd@$version" "$module/cmd/ctr@$version" "$module/cmd/containerd-shim-runc-v2@$version"
}

# critest is a compiled test binary (`go test -c`), which needs a main module to build in.
build_cri_tools() {
    local version=$1 module=sigs.k8s.io/cri-tools
    printf 'module koordnode.local/cri-tools-bed\n\ngo 1.26\n' >go.mod
    go get "$module@$version"
    local ldflags="-s -w -X $module/pkg/version.Version=${version#v}"
    go build -trimpath -ldflags "$ldflags" -o "$out/bin/crictl" "$module/cmd/crictl"
    go test -c -trimpath -ldflags "$ldflags" -o "$out/bin/critest" "$module/cmd/critest"
}

# Koordinator's go.mod has replace directives, so `go install ...@version` refuses it: its module
# source (read-only in the module cache) is copied and built as the main module.
build_koordinator() {
    local version=$1 dir
    dir=$(go mod download -json "github.com/koordinator-sh/koordinator@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir" ] || { echo "no module source downloaded for koordinator@$version"; return 1; }
    cp -r "$dir/." . && chmod -R u+w .
    go build -trimpath -ldflags "-s -w" -o "$out/bin/koord-manager" ./cmd/koord-manager
    go build -trimpath -ldflags "-s -w" -o "$out/bin/koord-scheduler" ./cmd/koord-scheduler
    mkdir -p "$out/crd" "$out/rbac" "$out/manager"
    cp config/crd/bases/*.yaml "$out/crd/"
    cp config/rbac/role.yaml "$out/rbac/koord-manager-role.yaml"
    cp config/rbac/scheduler_role.yaml "$out/rbac/koord-scheduler-role.yaml"
    cp config/manager/koord-prod.yaml config/manager/koord-mid.yaml config/manager/koord-batch.yaml \
        config/manager/koord-free.yaml "$out/manager/"
}

# koordlet links libpfm (perf event names) through cgo; the rest of the bed is static and cgo-free.
build_koordlet() {
    local version=$1 dir
    if ! dpkg -s libpfm4-dev >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpfm4-dev gcc libc6-dev
    fi
    dir=$(go mod download -json "github.com/koordinator-sh/koordinator@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir" ] || { echo "no module source downloaded for koordinator@$version"; return 1; }
    cp -r "$dir/." . && chmod -R u+w .
    CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "$out/bin/koordlet" ./cmd/koordlet
    go build -trimpath -ldflags "-s -w" -o "$out/bin/koord-runtime-proxy" ./cmd/koord-runtime-proxy
    mkdir -p "$out/manager"
    cp config/manager/koordlet.yaml "$out/manager/"
    cp config/rbac/koordlet.yaml "$out/manager/koordlet-rbac.yaml"
}

build_helm() {
    local version=$1 module=helm.sh/helm/v3
    GOBIN="$out/bin" go install -trimpath \
        -ldflags "-s -w -X $module/internal/version.version=$version -X $module/internal/version.gitTreeState=clean" \
        "$module/cmd/helm@$version"
}

for component in ${1:-containerd etcd cri-tools kubernetes}; do
    case $component in
        kubernetes) build kubernetes "$KUBERNETES_VERSION" build_kubernetes bin/kube-scheduler ;;
        containerd) build containerd "$CONTAINERD_VERSION" build_containerd ;;
        etcd) build etcd "$ETCD_VERSION" build_etcd ;;
        cri-tools) build cri-tools "$CRI_TOOLS_VERSION" build_cri_tools ;;
        koordinator) build koordinator "$KOORDINATOR_VERSION" build_koordinator bin/koord-scheduler ;;
        koordlet) build koordlet "$KOORDINATOR_VERSION" build_koordlet ;;
        helm) build helm "$HELM_VERSION" build_helm ;;
        *) echo "k8s-bed: unknown component $component" >&2; exit 2 ;;
    esac
done
