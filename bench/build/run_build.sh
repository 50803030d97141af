#!/bin/bash
# Build time and peak RSS per rank against model size on 4 CPU ranks (issue 11 benchmarks), before and after.
#   bench/build/run_build.sh OUTDIR CODE SIZE... MODE...    e.g. bench/build/run_build.sh bench/build/results after "768x12 1536x12" "pp2-tp2 zero3-dp4"
# CODE: `after` = this tree's launcher; anything else = a directory holding an older launcher/ (git archive <sha> launcher),
# run by the same driver (tests/parallel/build_memory_driver.py builds through launcher.train.build_engine).
# SIZE: HIDDENxLAYERS, or `0.8B` for the driver's own 2048 x 16 shape. Every run: flock /tmp/heavy.lock (unless
# HEAVY_LOCK_HELD=1), capped.sh 17.
set -u
out=$1; code=$2; sizes=$3; modes=$4
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
# Each run takes /tmp/heavy.lock; HEAVY_LOCK_HELD=1 when the caller already holds it for the whole batch.
lock="flock /tmp/heavy.lock"; [ "${HEAVY_LOCK_HELD:-}" = 1 ] && lock=
src=$repo; [ "$code" != after ] && src=$(cd "$code" && pwd)
tag=$([ "$code" = after ] && echo after || echo before)
for size in $sizes; do for mode in $modes; do
  ext=$(mktemp -d)
  env=(PYTHONPATH="$src" TORCH_EXTENSIONS_DIR="$ext" OMP_NUM_THREADS=1)
  [ "$size" != 0.8B ] && env+=(MODEL_HIDDEN="${size%x*}" MODEL_LAYERS="${size#*x}")
  [[ $mode == zero3* ]] && env+=(MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4194304)
  f="$out/build-$tag-$size-$mode.json"
  t0=$(date +%s)
  # The 2 cores are shared with other work: the 1-minute load average when the run starts (lock held) and when it
  # ends goes beside its times ($f.load; summarize.py prints it).
  $lock sh -c 'cut -d" " -f1 /proc/loadavg > "$0.load0"; exec "$@"' "$f" /work/shared/tools/capped.sh 17 -- env "${env[@]}" "$repo/.venv/bin/torchrun" --nproc_per_node 4 \
    --master_port 29751 "$repo/tests/parallel/build_memory_driver.py" "$f" "$mode" > "$f.log" 2>&1
  rc=$?
  load0=$(cat "$f.load0"); rm -f "$f.load0"
  echo "{\"load_start\": $load0, \"load_end\": $(cut -d' ' -f1 /proc/loadavg)}" > "$f.load"
  echo "$tag $size $mode rc=$rc $(( $(date +%s) - t0 ))s load $load0 -> $(cut -d' ' -f1 /proc/loadavg) $(grep -o '\[build_memory\].*' "$f.log" | cut -c1-400)"
  rm -rf "$ext"
done; done
