#!/usr/bin/env bash
# Everything the copy engine needs a GPU for, in one call on the device machine:
# build the extension with the CUDA kernels, ptxas / SASS facts, the GPU tests
# (plus the CPU copy tests), compute-sanitizer memcheck and racecheck on the
# GPU tests, the benchmark; a short summary last.
# Usage (from the repository root): bash benchmarks/gpu_check.sh [OUTDIR]
# BENCH_ARGS: extra bench_copy.py arguments; SKIP_SANITIZER=1 skips it;
# CUDA_ARCHS (default "90;80"); SKIP_TIERS=1 skips bench_tiers.py's GPU part
# (GPU <-> host moves, the forward beside an offload); SKIP_BENCH=1 skips both.
set -uo pipefail
OUT=${1:-${OUT:-/tmp/statecache-gpu}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
ROOT=$(pwd)
TMP=$(mktemp -d)  # build logs and SASS stay here unless something fails
log() { echo "== $*"; }

log "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
nvidia-smi -L
nvcc --version | tail -1
$PY -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), 'devices', torch.cuda.device_count())"

ARCHS=${CUDA_ARCHS:-90;80}
log "build (CUDA kernels for $ARCHS)"
cmake -S . -B build/gpu -G Ninja -DSTATECACHE_BUILD_PYTHON=ON -DSTATECACHE_BUILD_TESTS=OFF \
  -DSTATECACHE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v $PY)" -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/python/statecache" > "$TMP/cmake.log" 2>&1 || { cat "$TMP/cmake.log"; exit 1; }
ninja -C build/gpu > "$TMP/build.log" 2>&1 || { tail -40 "$TMP/build.log"; exit 1; }
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"  # carried wheels stay visible
$PY -c "import statecache as sc; print('has_gpu_kernels', sc.has_gpu_kernels)"

log "ptxas -v (sm_90, sm_80)"
nvcc -std=c++17 -O3 -Icsrc -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
  -Xptxas -v -c csrc/kernels/copy_kernels.cu -o "$TMP/copy_kernels.o" > "$OUT/ptxas.txt" 2>&1
grep -E "registers|spill|Compiling entry" "$OUT/ptxas.txt" | sed 's/_ZN.*copy_ops_kernel[^ ]*/copy_ops_kernel/'
cuobjdump -sass -arch sm_90 "$TMP/copy_kernels.o" > "$TMP/sass_sm90.txt" 2>&1
echo "sm_90 SASS memory instructions (count):"
grep -oE '\b(LDG|STG|LD|ST|LDL|STL)\.[A-Z0-9.]*' "$TMP/sass_sm90.txt" | sort | uniq -c | tr '\n' ';'; echo

log "tests (GPU + CPU copy engine, the host tier on the GPU)"
(cd tests/python && timeout 300 $PY -m pytest -q -p no:cacheprovider -rs copy/ tiers/test_tiers_gpu.py 2>&1 \
  | tee "$OUT/pytest.txt" | tail -15)

if [ -z "${SKIP_SANITIZER:-}" ]; then
  # Exact allocations (no caching allocator), so memcheck sees every byte
  # past a tensor; racecheck covers the inline build's shared-memory copy.
  for tool in memcheck racecheck; do
    log "compute-sanitizer --tool $tool"
    # A fixed host-link profile: the start-up probe means nothing under a sanitizer.
    (cd tests/python && PYTORCH_NO_CUDA_MEMORY_CACHING=1 STATECACHE_HOST_LINK=2,2,65536,65536 timeout 200 \
      compute-sanitizer --tool $tool \
      --print-limit 20 $PY -m pytest -q -p no:cacheprovider -x copy/test_copy_gpu.py -k "not 4096" > "$OUT/sanitizer_$tool.txt" 2>&1;
     echo "exit $?" >> "$OUT/sanitizer_$tool.txt")
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|exit" "$OUT/sanitizer_$tool.txt" | tail -4
  done
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  log "benchmark"
  $PY benchmarks/bench_copy.py ${BENCH_ARGS:-} --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  if [ -z "${SKIP_TIERS:-}" ]; then
    log "benchmark: GPU <-> host (bench_tiers.py)"
    $PY benchmarks/bench_tiers.py --skip-shared --skip-checksums --out "$OUT/bench_tiers.json" 2>&1 \
      | tee "$OUT/bench_tiers.txt"
  fi
  if [ -n "${DEVICES:-}" ]; then
    log "benchmark --devices $DEVICES"
    $PY benchmarks/bench_copy.py --devices "$DEVICES" --out "$OUT/bench_devices.json" 2>&1 | tee "$OUT/bench_devices.txt"
  fi
fi

log "summary"
grep -E "passed|failed" "$OUT/pytest.txt" | tail -1
grep -E "^target|^serial batch" "$OUT/bench.txt" 2>/dev/null
[ -f "$OUT/bench_tiers.txt" ] && grep -E "^host link|vs copy_|^\| [0-9]+ (KiB|images)|^\| same|^\| 8 bf16|^\| 16 GB" "$OUT/bench_tiers.txt"
true
