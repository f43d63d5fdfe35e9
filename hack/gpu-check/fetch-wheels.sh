#!/usr/bin/env bash
# Download the exact cp312 wheels hack/gpu-check.sh installs on the lent GPU machine (which has
# no network) into hack/gpu-check/wheels/, and check they stay under 40 MiB. Run it here, then
# name hack/gpu-check/wheels in the device call's carry.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$here/wheels}
limit_mib=40
mkdir -p "$dest"
mapfile -t wanted < <(grep -v '^\s*#' "$here/wheels.txt" | grep -v '^\s*$')
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$dest" "${wanted[@]}" 2>&1 |
    grep -v "^WARNING: Location" || true
for want in "${wanted[@]}"; do # exactly one wheel of each, at the pinned version
    name=${want%%==*}
    stem=$(echo "$name" | tr '-' '_')
    found=$(find "$dest" -maxdepth 1 -iname "${stem}-*.whl" | wc -l)
    [ "$found" -eq 1 ] || {
        echo "fetch-wheels: $found wheels of $name in $dest (want one, $want)" >&2
        exit 1
    }
    find "$dest" -maxdepth 1 -iname "${stem}-${want##*==}-*.whl" | grep -q . || {
        echo "fetch-wheels: $dest holds another version of $name than $want" >&2
        exit 1
    }
done
mib=$(du -sm "$dest" | cut -f1)
[ "$mib" -lt "$limit_mib" ] || {
    echo "fetch-wheels: $mib MiB of wheels, over the $limit_mib MiB limit" >&2
    exit 1
}
echo "fetch-wheels: ${#wanted[@]} wheels, $mib MiB, in $dest"
