# Engine at 160 ms on the H100: parts of 1024 / 2048 / 4096 rows (Recognizer part_rows), 10240-12288 streams.
. benchmarks/h100-2026-12-06j/setup.sh > /dev/null
run() { # rows streams tag
  timeout 80 python3 benchmarks/h100-2026-12-07f/parts.py $1 --plan engine:160:bf16:on --engine-start $2 --engine-max $2 --engine-refine 0 \
    --engine-cap-s 60 --budget-s 65 --out $OUT/e160-p$1-$2-$3.json 2>&1 | grep -E "^  engine|Error|error" | sed "s/^/parts $1, $2 ($3): /"
  python3 -c "
import json; p=json.load(open('$OUT/e160-p$1-$2-$3.json'))['items'][0]['probes'][0]
print('   ', {k: p[k] for k in ('streams','step_s','unpipelined_step_s','unpipelined_step_max_s','passed')})" 2>/dev/null
}
timeout 60 python3 benchmarks/h100-2026-12-07f/attn_warps.py 2>&1 | grep -v -i warn
run 1024 10240 1; run 2048 10240 1; run 1024 11264 1; run 2048 11264 1; run 2048 12288 1
run 2048 11264 2; run 1024 11264 2
