# #26 with HEAD: the bf16 <-> fp32 levels (1500 @ 160, 4500 @ 1120). One call (~560 s).
. .carry/setup.sh > /dev/null
MIGRATION_TESTS=0 MIGRATION_SETTLE_S=12 MIGRATION_THREAD_CPU=15 MIGRATION_TIMEOUT_S=280 \
  MIGRATION_SPECS="160:1500:bf16:cuda:0/fp32,cuda:0/bf16,cuda:0/fp32,cuda:0/bf16 1120:4500:bf16:cuda:0/fp32,cuda:0/bf16,cuda:0/fp32,cuda:0/bf16" \
  bash scripts/gpu_suite.sh migration 2>&1 | grep -v "^  \[moved\] {" | tail -40
xz -9 $OUT/*.log 2>/dev/null; true
