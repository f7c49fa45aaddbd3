# Next H100 call: the daemon with the attention kernel at 160 ms (call E of 07d was void), both arms;
# then the rest of a layer under torch.compile (does inductor fuse the feed-forward/conv/norm kernels?).
. .carry/setup.sh > /dev/null
for arm in kernel ref; do pp=/tmp/site:$PWD; [ $arm = ref ] && pp=$PWD/.carry/kernel/site:$pp
  PYTHONPATH=$pp timeout 150 python3 scripts/bench_capacity.py --plan daemon:160:bf16:on --daemon-at 160=${LEVEL:-7680} --workers 12 --client-procs 6 --daemon-args "--batch-wait-ms=2 --admission=max_streams" --seconds 8 --warmup-s 2 --budget-s 140 --out $OUT/d160-$arm.json > $OUT/d160-$arm.out 2>&1
  python3 -c "
import json; d=json.load(open('$OUT/d160-$arm.json')); l=d['items'][0]['levels'][0]; print('$arm', l['streams'], l['passed'], l['kept_up'], l['client_bound'], round(l['partial_latency_s']['p95'],3), round(l['final_latency_s']['p95'],3))"
done
timeout 240 python3 .carry/compile/layer_compile.py default 2>&1 | grep -v -i warn | tail -12
