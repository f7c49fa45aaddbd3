# Next H100 call (session 35): why 10240 x 160 ms fails (pipelined 0.19 s vs 0.148 alone; 9216 passes at 0.118):
# the step's host launch time and GPU time at 9216 and 10240 with graphs on; parts of 2048 vs 1024 at 10240.
. .carry/setup.sh > /dev/null
for n in 9216 10240; do
  timeout 90 python3 scripts/profile_engine_step.py --device cuda --dtype bf16 --chunk-ms 160 --streams $n --steps 8 \
    --graphs on --json $OUT/profile-on-$n.json > $OUT/profile-on-$n.txt 2>&1; echo "profile $n rc $?"
  grep -v -i warn $OUT/profile-on-$n.txt | head -14 | cut -c1-180
done
run() { # part_rows streams tag
  timeout 80 python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start $2 --engine-max $2 --engine-refine 0 \
    --part-rows $1 --engine-cap-s 60 --budget-s 65 --out $OUT/e160-p$1-$2-$3.json 2>&1 | grep -E "^  engine|Error" | sed "s/^/parts $1 ($3): /"
}
run 2048 10240 1; run 1024 10240 1; run 2048 10240 2; run 1024 10240 2
