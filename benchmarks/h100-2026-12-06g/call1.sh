# One call whatever card comes: the CUDA tests (segment gather of 05b8c33), then on an H200 #26's bf16 <-> fp16
# levels (acceptance), on an H100 the 3000 x 160 fp16 level (4 moves with d2bd0a5's fix; it had 3).
. .carry/setup.sh > /dev/null
timeout 100 python3 -m pytest -q -m cuda -p no:cacheprovider tests/engine/test_encoder_step_cuda.py tests/decoding/test_graphs_cuda.py tests/engine/test_streaming.py \
  tests/engine/test_migration_cuda.py > $OUT/cuda-tests.txt 2>&1; tail -3 $OUT/cuda-tests.txt
M="cuda:0/fp16,cuda:0/bf16,cuda:0/fp16,cuda:0/bf16"
if grep -q H200 $OUT/gpu.txt; then SPECS="160:3000:bf16:$M 1120:6000:bf16:$M"; else SPECS="160:3000:bf16:$M"; fi
echo "specs: $SPECS"
MIGRATION_TESTS=0 MIGRATION_SETTLE_S=12 MIGRATION_THREAD_CPU=15 MIGRATION_TIMEOUT_S=235 MIGRATION_SPECS="$SPECS" \
  bash scripts/gpu_suite.sh migration 2>&1 | grep -v "^  \[moved\] {" | tail -40
xz -9 $OUT/*.log 2>/dev/null; true
