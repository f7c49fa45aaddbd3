# old/new alternately (trees in /tmp/fe/old and /tmp/fe/new): front-end CPU a stream-second (one front end, 40 real-speech streams of 25 s)
for rc in 13 1; do for i in 1 2 3; do for arm in old new; do
  timeout 200 bash $(dirname $0)/run.sh /tmp/fe/$arm 89$((60+i)) $rc 40 25 2>&1 | grep front-end | sed "s/^/$arm run $i: /"
done; done; done
