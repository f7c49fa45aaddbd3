#!/usr/bin/env bash
# The CPU-machine side of recipes/run_gpu.sh, from the repository root:
#
#   bash recipes/gpu_carry.sh prepare           once: pack the text (4.4 MB -> 1.2 MB), make .carry/ckpt
#   bash recipes/gpu_carry.sh kokoro [MAX_MIB]  pack the Kokoro speech made so far (default 15 MiB)
#   bash recipes/gpu_carry.sh kokoro-eval       pack the reserved Kokoro voices' speech (eval calls)
#   bash recipes/gpu_carry.sh collect FILES_AT  after each train call: keep what came back
#   bash recipes/gpu_carry.sh sizes             what a train / eval call would carry, repo included
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
kokoro)
    # .carry/kokoro/{train,dev}: made by recipes.synthetic.kokoro (a background job may still be
    # adding to them); train rows that share a 6-gram with the current dev/eval text are left out.
    ${PYTHON:-python3} -m recipes.synthetic.carried pack .carry/kokoro/dev .carry/kokoro/train \
        --out .carry/kokoro.tar.xz --max-mib "${2:-15}" --held-apart .carry/text/dev.txt .carry/text/eval.txt
    ;;
kokoro-eval)
    ${PYTHON:-python3} -m recipes.synthetic.carried pack .carry/kokoro/eval --out .carry/kokoro-eval.tar.xz --max-mib 8
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
    # A call carries the repository's tracked files and the carried paths: 64 MiB in all.
    repo=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
    mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
    total() { { du -cb "$@" 2>/dev/null || true; } | tail -1 | cut -f1; }
    for f in .carry/tts/root.tar.xz .carry/text.tar.xz .carry/kokoro.tar.xz .carry/pico.tar.xz .carry/kokoro-eval.tar.xz; do
        if [ -f "$f" ]; then echo "  $f $(mib "$(total "$f")") MiB"; fi
    done
    train=$(( repo + $(total .carry/tts/root.tar.xz .carry/text.tar.xz .carry/kokoro.tar.xz .carry/pico.tar.xz "$CKPT"/summary.json "$CKPT"/last.pt.0*) ))
    evalc=$(( repo + $(total .carry/tts/root.tar.xz .carry/text.tar.xz .carry/kokoro-eval.tar.xz "$CKPT"/default-model.pt) ))
    echo "repo (tracked files) $(mib "$repo") MiB"
    echo "train call carries $(mib $train) MiB in all (repo, engines, text, kokoro, pico, $CKPT/last.pt.* if any) of 64"
    echo "eval call carries $(mib $evalc) MiB in all (repo, engines, text, kokoro-eval, $CKPT/default-model.pt) of 64"
    [ $train -le $((64 * 1048576)) ] || { echo "train call: over 64 MiB"; exit 1; }
    ;;
*)
    sed -n 2,12p "$0"
    exit 1
    ;;
esac
