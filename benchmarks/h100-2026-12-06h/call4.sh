# #29 item 2 on this card: the daemon's engine alone (live, churn, no websockets) vs the daemon at 160 ms, py-spy on the daemon's first level.
set -o pipefail
. .carry/setup.sh > /dev/null
timeout 330 python3 scripts/bench_capacity.py --plan live:160:bf16:on,daemon:160:bf16:on --daemon-guess 8192 \
  --live-at 160=6144/8192 --daemon-at 160=6144/5120 --live-s 10 --live-cap-s 90 --daemon-cap-s 120 --seconds 8 --warmup-s 2 --workers 8 --client-procs 6 \
  --daemon-args "--batch-wait-ms=2 --admission=max_streams" --py-spy 8 --budget-s 320 --out $OUT/capacity.json > $OUT/capacity.log 2>&1
echo "rc $?"; grep -v "^                " $OUT/capacity.log | grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |chunk|clients:|live " | cut -c1-160
for f in $OUT/daemon-*.log; do grep -E "engine: [0-9]+ steps|GPU worked|ran on a CPU" $f | tail -9 | cut -c30-; done
xz -9 $OUT/*.log $OUT/pyspy*.txt; true
