# Attention old vs new: micro, then engine step profile and engine capacity at 160 ms, new and old trees.
. .carry/setup.sh > /dev/null
python3 .carry/attn/att_bench.py 2>&1 | tee $OUT/att.txt
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/model tests/engine/test_encoder_step_cuda.py 2>&1 | tail -4 | tee -a $OUT/att.txt
rm -rf /tmp/old; mkdir -p /tmp/old; tar --exclude=./.git -cf - . | tar -C /tmp/old -xf -; cp .carry/attn/old_attention.py /tmp/old/streamd/model/attention.py
for arm in new old bench; do t=$PWD; pp=/tmp/site:$PWD; [ $arm = old ] && t=/tmp/old && pp=/tmp/site:$t
  [ $arm = bench ] && pp=$PWD/.carry/attn/bench_site:$pp
  (cd $t && PYTHONPATH=$pp timeout 100 python3 scripts/profile_engine_step.py --device cuda --dtype bf16 --chunk-ms 160 --streams 6144 --graphs on 2>&1 | grep -E "step .* median" | sed "s/^/$arm: /") | tee -a $OUT/att.txt
done
for arm in new old; do t=$PWD; [ $arm = old ] && t=/tmp/old
  (cd $t && PYTHONPATH=/tmp/site:$t timeout ${CAP_S:-100} python3 scripts/bench_capacity.py --plan engine:160:bf16:on --engine-start 6144 --engine-max 16384 --engine-cap-s $(( ${CAP_S:-100} - 15 )) --budget-s $(( ${CAP_S:-100} - 5 )) --out $OUT/cap-$arm.json 2>&1 | grep -E "^  engine" | sed "s/^/$arm: /") | tee -a $OUT/att.txt
done
