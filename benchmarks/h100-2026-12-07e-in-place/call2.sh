# Session 33: CUDA tests after the strided-rows fix; the subsampling's fused ReLU+mask; engine 160 ms new 8192.
. .carry/setup.sh > /dev/null
timeout 170 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model/test_attention_kernel.py tests/engine/test_encoder_step_cuda.py tests/engine/test_migration_cuda.py tests/engine/test_engine.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 50 python3 .carry/sub/micro2.py 2>&1 | grep -v -i warn
timeout 75 python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start 8192 --engine-max 8192 --engine-refine 0 --engine-cap-s 55 --budget-s 60 --out $OUT/e160-new-8192-3.json 2>&1 | grep -E "^  engine"
