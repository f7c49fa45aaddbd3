#!/usr/bin/env bash
# The CPU-machine side of recipes/run_gpu.sh, from the repository root:
#
#   bash recipes/gpu_carry.sh prepare           once: pack the text (4.4 MB -> 1.2 MB), make .carry/ckpt
#   bash recipes/gpu_carry.sh collect FILES_AT  after each train call: keep what came back
#   bash recipes/gpu_carry.sh sizes             what a train / eval call would carry
#
# collect: the training state (last.pt.000.. + summary.json) replaces .carry/ckpt's; parts of
# default-model.pt come back only when the dev WER beat the best so far, and are then joined into
# .carry/ckpt/default-model.pt (else the previous best stays); run.log is kept in .carry/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=.carry/ckpt

case "${1:-}" in
prepare)
    [ -f .carry/tts/root.tar.xz ] || { echo "run recipes/synthetic/engines.sh first"; exit 1; }
    [ -s .carry/text/train.txt ] || { echo "run python -m recipes.synthetic.text --out .carry/text first"; exit 1; }
    tar -cJf .carry/text.tar.xz -C .carry text/train.txt text/dev.txt text/eval.txt
    mkdir -p "$CKPT" .carry/logs
    ls -l .carry/tts/root.tar.xz .carry/text.tar.xz
    ;;
collect)
    F=${2:?usage: collect FILES_AT}
    mkdir -p "$CKPT" .carry/logs
    if ls "$F"/last.pt.0* >/dev/null 2>&1; then
        rm -f "$CKPT"/last.pt "$CKPT"/last.pt.0* "$CKPT"/summary.json
        cp "$F"/last.pt.0* "$F"/summary.json "$CKPT"/
        chmod u+w "$CKPT"/last.pt.0* "$CKPT"/summary.json  # what comes back is read-only
    else
        echo "no last.pt parts in $F: .carry/ckpt unchanged"
    fi
    if ls "$F"/default-model.pt.0* >/dev/null 2>&1; then
        cat "$F"/default-model.pt.0* > "$CKPT"/default-model.pt.new
        want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["files"].get("default-model.pt", ""))' "$F/summary.json")
        got=$(sha256sum "$CKPT"/default-model.pt.new | cut -d' ' -f1)
        [ "$want" = "$got" ] || { echo "default-model.pt parts do not match summary.json's sha256; kept the old one"; exit 1; }
        mv "$CKPT"/default-model.pt.new "$CKPT"/default-model.pt
        echo "new best model: $CKPT/default-model.pt"
    fi
    for f in run.log eval.md eval.json; do
        if [ -f "$F/$f" ]; then cp "$F/$f" ".carry/logs/$(date +%Y%m%d-%H%M%S)-$f"; fi
    done
    python3 - "$CKPT/summary.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["progress"]
print(f"step {p['step']}, epoch {p['epoch']}, best dev WER {p['best_wer']:.2f} at step {p['best_step']}, "
      f"{p['train_seconds'] / 60:.1f} min trained in {p['calls']} calls")
for h in p["history"][-4:]:
    print("  ", h)
EOF
    ls -l "$CKPT"
    ;;
sizes)
    du -cb .carry/tts/root.tar.xz .carry/text.tar.xz "$CKPT"/summary.json "$CKPT"/last.pt.0* 2>/dev/null | tail -1 | awk '{printf "train call carries %.1f MiB (+ the repo)\n", $1 / 1048576}'
    du -cb .carry/tts/root.tar.xz .carry/text.tar.xz "$CKPT"/default-model.pt 2>/dev/null | tail -1 | awk '{printf "eval call carries %.1f MiB (+ the repo)\n", $1 / 1048576}'
    ;;
*)
    sed -n 2,12p "$0"
    exit 1
    ;;
esac
