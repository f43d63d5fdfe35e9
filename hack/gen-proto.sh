#!/usr/bin/env bash
# Generate the Python gRPC stubs for every .proto under proto/ into one flat package.
#
#   hack/gen-proto.sh [OUT_DIR]     (default: baton/_pb)
#
# protoc names imports after the proto's directory (e.g. `from baton.agent.v1 import agent_pb2`),
# which would collide with our own packages, so the generated imports are made relative.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-baton/_pb}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mapfile -t protos < <(find proto -name '*.proto' | sort)
"$python" -m grpc_tools.protoc -I proto \
    --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" "${protos[@]}"

mkdir -p "$out"
find "$out" -maxdepth 1 -name '*_pb2*' -delete
while IFS= read -r -d '' file; do
    name=$(basename "$file")
    sed -E '/^from google\.protobuf /!s/^from [A-Za-z0-9_.]+ import ([A-Za-z0-9_]+_pb2)( as |$)/from . import \1\2/' \
        "$file" >"$out/$name"
done < <(find "$work" -name '*_pb2*' -print0)
[ -f "$out/__init__.py" ] || printf '"""Generated gRPC stubs (hack/gen-proto.sh). Do not edit."""\n' >"$out/__init__.py"
