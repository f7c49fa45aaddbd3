# #26's 6000 x 1120 ms bf16 <-> fp16 x4 level (the H200 acceptance level) on whatever card comes.
. .carry/setup.sh > /dev/null
M="cuda:0/fp16,cuda:0/bf16,cuda:0/fp16,cuda:0/bf16"
MIGRATION_TESTS=0 MIGRATION_SETTLE_S=12 MIGRATION_THREAD_CPU=15 MIGRATION_TIMEOUT_S=280 MIGRATION_SPECS="1120:6000:bf16:$M" \
  bash scripts/gpu_suite.sh migration 2>&1 | grep -v "^  \[moved\] {" | tail -40
xz -9 $OUT/*.log 2>/dev/null; true
