#!/usr/bin/env python3
"""Where a front end's main thread was, from py-spy raw samples taken with --idle --threads:
`python3 spy_summary.py call1/*spy*.txt` (xz -d them first)."""
import collections,re,sys
for f in sys.argv[1:]:
    thr=collections.Counter(); cat=collections.Counter(); tot=0
    for line in open(f):
        stack,n=line.rstrip().rsplit(' ',1); n=int(n)
        fs=stack.split(';'); t=fs[0].split(': ')[-1]; thr[t]+=n
        if t!='MainThread': continue
        tot+=n; s=stack
        if 'select (selectors.py' in s and 'Handle._run' not in s: k='idle in epoll'
        elif 'emit (logging' in s or 'logging/__init__' in s: k='logging'
        elif 'Activity' in s: k='gate'
        elif '_send_results' in s: k='results (other)'
        elif 'Front.handler' in s or 'protocol_handler' in s: k='receive/handler'
        elif '_read_ready' in s: k='socket reads'
        elif '_flush' in s: k='flush to engine'
        elif '_dispatch' in s: k='dispatch'
        elif 'collect' in s.lower() or 'gc' in fs[-1]: k='gc'
        else: k='other: '+re.sub(r' \(.*','',fs[-1])
        cat[k]+=n
    print(f, dict(thr))
    for k,n in cat.most_common(12): print(f"   {100*n/tot:5.1f} {k}")
