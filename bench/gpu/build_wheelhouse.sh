#!/usr/bin/env bash
# Build bench/gpu/wheelhouse/ (git-ignored): every wheel a bare GPU image (CUDA + PyTorch + transformers,
# Python 3.12, no internet) lacks for `launcher train` / `launcher calibrate`, pinned to the versions this
# repository's .venv runs (make setup), then prove the set closed (check_wheelhouse.py).
#
#   bash bench/gpu/build_wheelhouse.sh                    # prints the size
#   bash bench/gpu/build_wheelhouse.sh --with-datasets    # + datasets / pyarrow / pandas for data=hf
#
# Two of them exist on the registry only as sdists and are built here into pure-Python wheels:
# deepspeed 0.19.8 (DS_BUILD_OPS=0: its CUDA ops, FusedAdam included, are JIT-compiled on the GPU machine
# the first time they are used) and antlr4-python3-runtime 4.9.3 (omegaconf's grammar runtime).
# The rest are downloaded as cp312 manylinux wheels (pip download --python-version 3.12 --only-binary).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PY:-$root/.venv/bin/python}"
wh="$here/wheelhouse"
rm -rf "$wh"; mkdir -p "$wh"

reqs=("$here/requirements-gpu.txt")
if [ "${1:-}" = "--with-datasets" ]; then reqs+=("$here/requirements-gpu-hf.txt"); fi
names=$(cat "${reqs[@]}" | grep -v '^\s*#' | sed 's/[=<> ].*//' | grep -v '^$')
pins=()
for n in $names; do
  v=$("$py" -m pip show "$n" 2>/dev/null | awk '/^Version:/{print $2}')
  if [ -z "$v" ]; then echo "not installed in $py: $n (run make setup)" >&2; exit 1; fi
  pins+=("$n==$v")
done
printf '%s\n' "${pins[@]}" > "$wh/pins.txt"

sdists=(); wheels=()
for p in "${pins[@]}"; do
  case "$p" in deepspeed==*|antlr4-python3-runtime==*) sdists+=("$p");; *) wheels+=("$p");; esac
done
# --no-build-isolation: deepspeed's setup.py imports torch, which .venv has (CPU build; no ops are compiled).
DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$wh" "${sdists[@]}"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d "$wh" "${wheels[@]}"
"$py" "$here/check_wheelhouse.py" "$wh"
du -sh "$wh"

# The same install the GPU machine runs (bench/gpu/run.sh), into a fresh target dir, for CPython 3.12:
# pip resolves the pinned set from the wheelhouse alone (--no-index), with the image's packages as given.
target="$(mktemp -d)"
"$py" -m pip install -q --no-index --find-links "$wh" --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --target "$target" -r "$wh/pins.txt"
echo "installed into a fresh --target for CPython 3.12: $(ls "$target" | grep -c dist-info) distributions"
rm -rf "$target"
