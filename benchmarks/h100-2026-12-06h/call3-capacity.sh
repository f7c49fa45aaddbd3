# #29 with the new benchmark model: daemon levels above those 2026-12-06d held (4096 @ 160, 7056 @ 1120), engine refined. One call (~300 s).
set -o pipefail
. .carry/setup.sh > /dev/null
timeout 290 python3 scripts/bench_capacity.py --plan engine:160:bf16:on,daemon:160:bf16:on,daemon:1120:bf16:on \
  --engine-start 8192 --engine-max 16384 --engine-refine 2 --engine-cap-s 50 --daemon-cap-s 90 \
  --daemon-at 160=4096/5120/6144,1120=7056/8768 --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 \
  --daemon-args "--batch-wait-ms=2 --admission=max_streams" --budget-s 280 --out $OUT/capacity.json > $OUT/capacity.log 2>&1
echo "rc $?"; grep -v "^                " $OUT/capacity.log | grep -E "engine +[0-9]+ streams|^ +[0-9]+ +[0-9]+ +[0-9.]+ |chunk|daemon/engine" | cut -c1-150
xz -9 $OUT/*.log; true
