#!/usr/bin/env bash
# The CPU-machine side of recipes/run_gpu.sh, from the repository root:
#
#   bash recipes/gpu_carry.sh prepare           once: pack the text (4.4 MB -> 1.4 MB) and the engines for
#                                              train calls (.carry/tts/root-lean.tar.xz), make .carry/ckpt
#   bash recipes/gpu_carry.sh kokoro [MAX_MIB [NAME]]  pack the Kokoro speech made so far (default 15 MiB)
#                                              as .carry/NAME.tar.xz (default kokoro; kokoro2, kokoro3..:
#                                              what the packs already made do not carry, for a warm machine)
#   bash recipes/gpu_carry.sh kokoro-eval       pack the reserved Kokoro voices' speech (eval calls)
#   bash recipes/gpu_carry.sh classic N [MAX_MIB] N utterances of the classic engines made here, packed
#                                              (.carry/classic.tar.xz: when the engines cannot travel)
#   bash recipes/gpu_carry.sh real SRC          the real-speech corpus: .carry/real.tar.xz (train
#                                              re-encoded smaller, dev as is) and .carry/sndlib.tar.xz
#                                              (libsndfile and its codecs: decoding without the engines)
#   bash recipes/gpu_carry.sh collect FILES_AT  after each train call: keep what came back
#   bash recipes/gpu_carry.sh sizes PATH...     what a call carrying PATH... would carry, repo included
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
    # train calls: the engines without festival (train calls synthesise with
    # SYNTH_ENGINES=espeak-ng,espeak,flite) and without the reserved flite voice: 25 -> ~12 MiB
    tar -xJf .carry/tts/root.tar.xz -C .carry/tts
    tar -cJf .carry/tts/root-lean.tar.xz -C .carry/tts --exclude='root/usr/share/festival' \
        --exclude='root/usr/lib/festival' --exclude='root/usr/bin/festival' --exclude='root/usr/bin/flite_cmu_us_slt' \
        --exclude='root/usr/lib/x86_64-linux-gnu/libest*' --exclude='root/usr/lib/x86_64-linux-gnu/libgomp*' \
        --exclude='root/usr/lib/x86_64-linux-gnu/libflite_cmu_us_slt*' root
    mkdir -p "$CKPT" .carry/logs
    ls -l .carry/tts/root.tar.xz .carry/tts/root-lean.tar.xz .carry/text.tar.xz
    ;;
kokoro)
    # .carry/kokoro/{train,dev}: made by recipes.synthetic.kokoro (a background job may still be
    # adding to them; jobs writing .carry/kokoro/train-* are joined into train first); train rows
    # that share a 6-gram with the current dev/eval text are left out.
    # The parts in reverse order (train-3 train-2 ...): this session's new seeds (the highest parts)
    # are packed before the speech earlier sessions trained on.
    if ls -d .carry/kokoro/train-* >/dev/null 2>&1; then
        ${PYTHON:-python3} -m recipes.synthetic.carried join --out .carry/kokoro/train $(ls -d .carry/kokoro/train-* | sort -rV)
    fi
    # The first pack (kokoro) carries the dev set too; a later one (kokoro2..) only the train rows
    # that no earlier pack carries.
    NAME=${3:-kokoro}
    SETS=(.carry/kokoro/dev .carry/kokoro/train)
    EARLIER=()
    if [ "$NAME" != kokoro ]; then
        SETS=(.carry/kokoro/train)
        for f in .carry/kokoro.tar.xz .carry/kokoro[0-9]*.tar.xz; do
            [ -f "$f" ] && [ "$f" != ".carry/$NAME.tar.xz" ] && EARLIER+=("$f")
        done
    fi
    ${PYTHON:-python3} -m recipes.synthetic.carried pack "${SETS[@]}" \
        --out ".carry/$NAME.tar.xz" --max-mib "${2:-15}" --held-apart .carry/text/dev.txt .carry/text/eval.txt \
        --not-in "${EARLIER[@]}"
    ;;
kokoro-eval)
    ${PYTHON:-python3} -m recipes.synthetic.carried pack .carry/kokoro/eval --out .carry/kokoro-eval.tar.xz --max-mib 8
    ;;
classic)
    rm -rf .carry/classic /tmp/streamd-classic
    ${PYTHON:-python3} -m recipes.synthetic.synth --text .carry/text/train.txt --voices train --n "${2:?usage: classic N}" \
        --out /tmp/streamd-classic --engines-root .carry/tts/root --seed 100
    ${PYTHON:-python3} -m recipes.synthetic.carried encode --src /tmp/streamd-classic --out .carry/classic/train
    ${PYTHON:-python3} -m recipes.synthetic.carried pack .carry/classic/train --out .carry/classic.tar.xz \
        --max-mib "${3:-10}" --held-apart .carry/text/dev.txt .carry/text/eval.txt
    ;;
real)
    SRC=${2:?usage: real SRC (the real-speech folder)}
    # Speech Commands (4,482 single words) thinned to 60 %, as in every call since 2026-12-03
    ${PYTHON:-python3} -m recipes.real_speech --src "$SRC" --out .carry/real --train-level 0.98 \
        --keep speech_commands=0.6
    ${PYTHON:-python3} -m recipes.synthetic.carried pack .carry/real/realdev .carry/real/train \
        --out .carry/real.tar.xz --max-mib 40
    L=.carry/tts/root/usr/lib/x86_64-linux-gnu
    tar -cJhf .carry/sndlib.tar.xz --transform 's,^.*/,sndlib/,' \
        $L/libsndfile.so.1 $L/libFLAC.so.12 $L/libvorbis.so.0 $L/libvorbisenc.so.2 $L/libopus.so.0 \
        $L/libogg.so.0 $L/libmpg123.so.0 $L/libmp3lame.so.0
    ls -l .carry/real.tar.xz .carry/sndlib.tar.xz
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
    # A call carries the repository's files as they are in the working tree (a modified file
    # travels as modified) and the paths it names in `carry`: 64 MiB in all.
    shift
    mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
    repo=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    carried=0
    for f in "$@"; do
        b=$(du -cb "$f" | tail -1 | cut -f1)
        echo "  $f $(mib "$b") MiB"
        carried=$((carried + b))
    done
    echo "repo $(mib "$repo") MiB + carried $(mib $carried) MiB = $(mib $((repo + carried))) MiB of 64"
    [ $((repo + carried)) -le $((64 * 1048576)) ] || { echo "over 64 MiB"; exit 1; }
    ;;
*)
    sed -n 2,12p "$0"
    exit 1
    ;;
esac
