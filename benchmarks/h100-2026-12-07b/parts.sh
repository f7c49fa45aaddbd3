. .carry/setup.sh > /dev/null
for p in 1024 2048 3072 1024 3072; do PART_ROWS=$p PYTHONPATH=$PWD/.carry/attn/part_site:/tmp/site:$PWD timeout 100 python3 scripts/profile_engine_step.py --device cuda --dtype bf16 --chunk-ms 160 --streams 6144 --graphs on 2>&1 | grep -E "step .* median" | sed "s/^/part $p: /"; done
