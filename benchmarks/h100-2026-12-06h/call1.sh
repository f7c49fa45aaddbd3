# Where 6000 x 1120 ms's lateness before any move comes from: the daemon's log now has each front end's
# event-loop lateness and CPU (73c67f1), the JSON the client processes' (7a9dcf9). One move, short.
. .carry/setup.sh > /dev/null
MIGRATION_TESTS=0 MIGRATION_SETTLE_S=12 MIGRATION_THREAD_CPU=15 MIGRATION_TIMEOUT_S=${T:-130} MIGRATION_SPECS="1120:6000:bf16:cuda:0/fp16" \
  bash scripts/gpu_suite.sh migration 2>&1 | grep -v "^  \[moved\] {" | tail -12
for f in $OUT/*.daemon.log; do grep -E "front end [0-9]+:|engine: [0-9]+ steps|GPU worked" $f | tail -40; done
xz -9 $OUT/*.log 2>/dev/null; true
