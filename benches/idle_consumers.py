"""Parks N consumers on an empty topic ("idle") of a running broker and reports
the broker's CPU and context switches while they wait.

usage: idle_consumers.py HOST:PORT CONSUMERS SECONDS BROKER_PID
"""
import socket, selectors, sys, time, os
addr = sys.argv[1]; n = int(sys.argv[2]); secs = float(sys.argv[3]); pid = int(sys.argv[4])
host, port = addr.split(':'); port = int(port)
sel = selectors.DefaultSelector()
req = b"GET /v1/topics/idle/consume?wait=10s HTTP/1.1\r\nhost: x\r\n\r\n"
socks = []
for i in range(n):
    s = socket.create_connection((host, port)); s.setblocking(False)
    s.sendall(req); sel.register(s, selectors.EVENT_READ); socks.append(s)
def cpu():
    f = open(f"/proc/{pid}/stat").read().split(); return int(f[13]) + int(f[14])
def ctx():
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if 'ctxt_switches' in line: total += int(line.split()[1])
    return total
time.sleep(1.0)
c0, x0, t0 = cpu(), ctx(), time.time()
answered = 0
end = t0 + secs
while time.time() < end:
    for key, _ in sel.select(timeout=0.5):
        s = key.fileobj
        data = s.recv(65536)
        if data:
            answered += 1
            s.sendall(req)
c1, x1, t1 = cpu(), ctx(), time.time()
tck = os.sysconf('SC_CLK_TCK')
print(f"consumers={n} secs={t1-t0:.1f} broker_cpu_pct={(c1-c0)/tck/(t1-t0)*100:.2f} ctx_per_s={(x1-x0)/(t1-t0):.0f} answered={answered}")
