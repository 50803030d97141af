#!/usr/bin/env bash
# The GPU pack: run first on a bare GPU machine (CUDA + PyTorch + transformers, Python 3.12, no internet).
#
#   bash bench/gpu/run.sh                        # every step (may pass 10 minutes); results under $OUT (the device tool's folder) or bench/gpu/out/
#   bash bench/gpu/run.sh install env checks     # only those steps (a device call runs 10 minutes at most: split
#   bash bench/gpu/run.sh env calibrate          #  the pack over calls while the machine stays warm)
#   bash bench/gpu/run.sh env train
#
# Carry bench/gpu/wheelhouse (built here by bench/gpu/build_wheelhouse.sh, ~31 MiB, git-ignored). Steps:
#   1. install the wheelhouse (pip --no-index: nothing is fetched), falling back to --no-deps when the image's
#      own packages do not satisfy a pin (the failure is kept in install.log)
#   2. describe the machine (env.json: GPU, driver, CUDA, torch, NCCL, deepspeed)
#   3. `launcher calibrate` into profile-<gpu>.yaml when the command exists (skipped with a message otherwise), then
#      `launcher calibrate --check` against it (calibrate-check.log)
#   4. gpu_checks.py: NCCL preflight, FusedAdam against torch.optim.AdamW, the SDPA flash kernel in use
#   5. train_1b.py: a ~1B LLaMA, bf16, seq 2048, ZeRO-1 on every local GPU with `launcher train`:
#      tokens/s, MFU and peak memory against `launcher plan` for the same config (train-1b.json)
# CALIBRATE_TIMEOUT / TRAIN_TIMEOUT (seconds, default 420 / 540) bound steps 3 and 5. Each step runs even when an earlier one failed; the exit status is the number of failed steps.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
py="${PYTHON:-$(command -v python3 || command -v python)}"
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
failed=0
steps="${*:-install env calibrate checks train}"
want() { [[ " $steps " == *" $1 "* ]]; }
step() { echo "== $1"; }

wh="$here/wheelhouse"
if ! want install; then :
elif [ ! -f "$wh/pins.txt" ]; then
  step "install the wheelhouse"
  echo "no $wh/pins.txt: build it with bench/gpu/build_wheelhouse.sh and carry bench/gpu/wheelhouse" | tee "$out/install.log"
  failed=$((failed + 1))
else
  step "install the wheelhouse"
  pipi() { "$py" -m pip install --disable-pip-version-check --no-index --find-links "$wh" "$@" -r "$wh/pins.txt"; }
  { pipi || pipi --break-system-packages || { echo "-- resolution failed; installing the pins with --no-deps";
    pipi --no-deps || pipi --no-deps --break-system-packages; }; } > "$out/install.log" 2>&1 || failed=$((failed + 1))
  tail -3 "$out/install.log"
fi

if want env; then
  step "describe the machine"
  "$py" "$here/gpu_checks.py" env --out "$out" || failed=$((failed + 1))
fi

if ! want calibrate; then :
elif "$py" -m launcher calibrate --help > /dev/null 2>&1; then
  step "launcher calibrate"
  gpu=$("$py" -c "import json; print(json.load(open('$out/env.json'))['launcher_gpu'])")
  ngpu=$("$py" -c "import json; print(json.load(open('$out/env.json'))['gpus'])")
  timeout "${CALIBRATE_TIMEOUT:-420}" "$py" -m launcher calibrate "cluster=$gpu" cluster.nodes=1 "cluster.gpus_per_node=$ngpu" \
    --out "$out/profile-$gpu.yaml" 2>&1 | tee "$out/calibrate.log" || failed=$((failed + 1))
  # The same machine against the profile just written (`launcher calibrate --check`, ~10 s; its GPU path has not run
  # elsewhere): exit 0 within 10%, 1 when a rate moved (a reading, not a failure), anything else a failure.
  if [ -f "$out/profile-$gpu.yaml" ] && "$py" -m launcher calibrate --help 2>/dev/null | grep -q -- --check; then
    step "launcher calibrate --check"
    timeout 120 "$py" -m launcher calibrate --check "cluster=$gpu" cluster.nodes=1 "cluster.gpus_per_node=$ngpu" \
      "cluster.profile=$out/profile-$gpu.yaml" > "$out/calibrate-check.log" 2>&1
    rc=$?; cat "$out/calibrate-check.log"; [ "$rc" -le 1 ] || failed=$((failed + 1))
  fi
else
  step "launcher calibrate"
  echo "skipped: this checkout has no \`launcher calibrate\` (issue 14 part 3 adds it)" | tee "$out/calibrate.log"
fi

if want checks; then
  step "NCCL, FusedAdam, SDPA flash"
  "$py" "$here/gpu_checks.py" checks --out "$out" || failed=$((failed + 1))
fi

if want train; then
  step "1B LLaMA training run against the plan"
  "$py" "$here/train_1b.py" --out "$out" --timeout "${TRAIN_TIMEOUT:-540}" || failed=$((failed + 1))
fi

echo "== done: $failed step(s) failed; results in $out"
exit "$failed"
