import subprocess, threading, time, os, sys
p = subprocess.Popen(["/work/main/target/release/tally","bench","--quick","--only","e2e","--out","/tmp/bq/ws%d" % int(time.time())], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
hz = os.sysconf('SC_CLK_TCK')
samples = []
last = {}
def cpu(name):
    try:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                st = open(f"/proc/{p.pid}/task/{tid}/stat").read()
            except OSError: continue
            comm = st[st.index('(')+1:st.rindex(')')]
            f = st[st.rindex(')')+2:].split()
            last[(tid, comm)] = int(f[11]) + int(f[12])
    except OSError: pass
    return sum(v for (t, c), v in last.items() if name is None or c == name) / hz
def sampler():
    while p.poll() is None:
        samples.append((time.monotonic(), cpu("tally-writer"), cpu(None)))
        time.sleep(0.05)
threading.Thread(target=sampler, daemon=True).start()
marks = []
t0 = time.monotonic()
for line in p.stderr:
    if line.startswith("[bench] e2e"):
        marks.append((time.monotonic(), line.strip()))
p.wait()
def at(t):
    best = None
    for s in samples:
        if s[0] <= t: best = s
    return best
prev = None
for (t, l) in marks:
    # the run ends at t; it started at the previous mark (approx)
    if prev is not None:
        a, b = at(prev), at(t)
        if a and b and b[0] > a[0]:
            w = b[0]-a[0]
            print(f"{l[12:]:60s} wall {w:5.2f}s writer {100*(b[1]-a[1])/w:5.1f}% process {100*(b[2]-a[2])/w:5.1f}%")
    prev = t
