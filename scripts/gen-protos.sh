#!/usr/bin/env bash
# Regenerate the Python CRI bindings (koordnode/cri/api_pb2*.py{,i}) from
# protos/koordnode/cri/api.proto, and the NRI ones (koordnode/nri/{api,ttrpc}_pb2.py{,i};
# messages only: koordnode has its own ttrpc) from protos/koordnode/nri/. The generated
# files are checked in; tests/test_proto.py and tests/test_nri_proto.py fail when they
# drift from this script's output.
#
# Usage: scripts/gen-protos.sh [OUT_DIR]   (default: the repository root)
# Needs grpcio-tools (pinned in pyproject's test extra so output is stable).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="$(mkdir -p "${1:-$repo_root}" && cd "${1:-$repo_root}" && pwd)"
python_bin="${PYTHON:-python}"

cd "$repo_root"
"$python_bin" -m grpc_tools.protoc \
    -Iprotos \
    --python_out="$out_dir" \
    --pyi_out="$out_dir" \
    --grpc_python_out="$out_dir" \
    protos/koordnode/cri/api.proto
"$python_bin" -m grpc_tools.protoc \
    -Iprotos \
    --python_out="$out_dir" \
    --pyi_out="$out_dir" \
    protos/koordnode/nri/api.proto protos/koordnode/nri/ttrpc.proto
