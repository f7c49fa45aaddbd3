# Front-end CPU per second of audio, end to end on this machine: a real daemon (default model, 160 ms chunks,
# one front end), 40 real-time real-speech streams of 20 s from scripts/load.py, the front end's CPU from /metrics.
# bash front_cpu_local.sh TREE PORT SPEECH_FILE   (run in each tree, alternately; PYTHON: the venv's python)
tree=$1; port=$2; speech=$3; py=${PYTHON:-python3}
cd $tree
PYTHONPATH=$tree $py -m streamd serve --port $port --admin-socket "" --workers 1 --right-context 1 --max-streams 80 > /tmp/fe-$port.log 2>&1 &
P=$!
for i in $(seq 120); do curl -s -o /dev/null localhost:$port/readyz && break; sleep 0.5; done
m() { curl -s localhost:$port/metrics | awk '/^streamd_front_cpu_seconds_total /{c=$2} /^streamd_audio_seconds_total /{a=$2} END{print c, a}'; }
before=$(m)
PYTHONPATH=$tree $py scripts/load.py --url ws://127.0.0.1:$port --start 40 --max-streams 40 --refine 0 --seconds 20 \
  --client-procs 1 --json /tmp/fe-$port.json $speech > /tmp/fe-load-$port.log 2>&1
after=$(m)
kill -INT $P; wait $P 2>/dev/null
python3 -c "
b=list(map(float,'$before'.split())); a=list(map(float,'$after'.split()))
cpu=a[0]-b[0]; aud=a[1]-b[1]
print(f'$tree: front-end CPU {cpu:.2f} s for {aud:.0f} s of audio: {1e3*cpu/aud:.2f} ms a stream-second')"
