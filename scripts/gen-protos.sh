#!/usr/bin/env bash
# Regenerate the Python CRI bindings (koordnode/cri/api_pb2.py{,i}) from
# protos/koordnode/cri/api.proto, the tests' gRPC client stubs for them
# (tests/support/api_pb2_grpc.py: they import grpc, which the product neither uses nor ships),
# and the NRI ones (koordnode/nri/{api,ttrpc}_pb2.py{,i}; messages only: koordnode has its own
# ttrpc) from protos/koordnode/nri/. The generated files are checked in; tests/test_proto.py and
# tests/test_nri_proto.py fail when they drift from this script's output.
#
# Usage: scripts/gen-protos.sh [OUT_DIR]   (default: the repository root)
# Needs grpcio-tools (pinned in pyproject's test extra so output is stable).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="$(mkdir -p "${1:-$repo_root}" && cd "${1:-$repo_root}" && pwd)"
python_bin="${PYTHON:-python}"

stubs_dir="$(mktemp -d)"
trap 'rm -rf "$stubs_dir"' EXIT

cd "$repo_root"
"$python_bin" -m grpc_tools.protoc \
    -Iprotos \
    --python_out="$out_dir" \
    --pyi_out="$out_dir" \
    --grpc_python_out="$stubs_dir" \
    protos/koordnode/cri/api.proto
mkdir -p "$out_dir/tests/support"
mv "$stubs_dir/koordnode/cri/api_pb2_grpc.py" "$out_dir/tests/support/api_pb2_grpc.py"
"$python_bin" -m grpc_tools.protoc \
    -Iprotos \
    --python_out="$out_dir" \
    --pyi_out="$out_dir" \
    protos/koordnode/nri/api.proto protos/koordnode/nri/ttrpc.proto
