# A front end's CPU a stream-second: a real daemon (default model, one front end), STREAMS real-time real-speech
# streams from scripts/load.py, the CPU from /metrics. With a 6th argument, py-spy records the front end meanwhile.
# bash run.sh TREE PORT RC STREAMS SECONDS [pyspy]   (PYTHON: the venv's python; SPEECH: a recording; EXTRA: serve flags)
tree=$1; port=$2; rc=$3; n=$4; secs=$5; py=${PYTHON:-python3}
speech=${SPEECH:-/work/shared/data/real-speech/ls_test_other/1688-142285-0000.ogg}
cd $tree
PYTHONPATH=$tree $py -m streamd serve --port $port --admin-socket "" --workers 1 --right-context $rc --max-streams 400 $EXTRA > /tmp/fe-d-$port.log 2>&1 &
P=$!
for i in $(seq 120); do curl -s -o /dev/null localhost:$port/readyz && break; sleep 0.5; done
m() { curl -s localhost:$port/metrics | awk '/^streamd_front_cpu_seconds_total /{c=$2} /^streamd_audio_seconds_total /{a=$2} END{print c, a}'; }
before=$(m)
PYTHONPATH=$tree $py scripts/load.py --url ws://127.0.0.1:$port --start $n --max-streams $n --refine 0 --seconds $secs \
  --client-procs 1 --json /tmp/fe-l-$port.json $speech > /tmp/fe-load-$port.log 2>&1 &
L=$!
if [ -n "$6" ]; then sleep 6; ps --ppid $P -o pid=,pcpu=,args= | cut -c1-120 > /tmp/fe-ps-$port.txt; fe=$(ps --ppid $P -o pid=,pcpu= --sort=-pcpu | head -1 | awk "{print \$1}")
  PYTHONPATH=/tmp/pyspy /tmp/pyspy/bin/py-spy record -p $fe -d $((secs-8)) -r 100 --gil -f raw -o /tmp/fe-spy-$port.txt > /dev/null 2>&1; fi
wait $L
after=$(m)
kill -INT $P; wait $P 2>/dev/null
python3 -c "
b=list(map(float,'$before'.split())); a=list(map(float,'$after'.split()))
cpu=a[0]-b[0]; aud=a[1]-b[1]
print(f'$tree rc $rc n $n: front-end CPU {cpu:.2f} s for {aud:.0f} s of audio: {1e3*cpu/aud:.2f} ms a stream-second')"
tail -3 /tmp/fe-load-$port.log
