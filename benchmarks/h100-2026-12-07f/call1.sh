# Next H100 call (session 34): the CUDA suite after the strided-rows fix; the engine at 9216 x 160 ms; where the
# per-stream cost rises past 8192 (profile_engine_step, graphs off, kernels) at 8192 and 9728.
. benchmarks/h100-2026-12-06j/setup.sh > /dev/null
timeout 230 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model tests/engine 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 75 python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start 9216 --engine-max 9216 --engine-refine 0 \
  --engine-cap-s 55 --budget-s 60 --out $OUT/e160-new-9216.json 2>&1 | grep -E "^  engine"
for n in 8192 9728; do
  timeout 85 python3 scripts/profile_engine_step.py --device cuda --dtype bf16 --chunk-ms 160 --streams $n --steps 4 \
    --graphs off --kernels 18 --json $OUT/profile-$n.json > $OUT/profile-$n.txt 2>&1; echo "profile $n rc $?"
  grep -v -i warn $OUT/profile-$n.txt | head -60 | cut -c1-160
done
