# #26 bf16 <-> fp16 x4 at both acceptance levels (3000 x 160, 6000 x 1120) in one call: the repeat.
. .carry/setup.sh > /dev/null
M="cuda:0/fp16,cuda:0/bf16,cuda:0/fp16,cuda:0/bf16"
MIGRATION_TESTS=0 MIGRATION_SETTLE_S=12 MIGRATION_THREAD_CPU=15 MIGRATION_TIMEOUT_S=260 MIGRATION_SPECS="160:3000:bf16:$M 1120:6000:bf16:$M" \
  bash scripts/gpu_suite.sh migration 2>&1 | grep -v "^  \[moved\] {" | tail -40
xz -9 $OUT/*.log 2>/dev/null; true
