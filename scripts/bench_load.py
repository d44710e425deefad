"""scripts/bench-envoy.py's plumbing: child processes, CPU accounting, the study-shaped request
bodies and the asyncio HTTP/1.1 load client. Bench-only; no dependencies beyond the standard library."""
import asyncio
import collections
import json
import os
import random
import socket
import subprocess
import sys
import time

PROCS = []
UNROUTED = "200 without target-pod"  # a failure of a request kvroute should have routed
MISROUTED = "target-pod is not the replica that answered"


def start(cmd, log, marker=None, timeout=30.0, env=None):
    """Starts cmd with stderr (and stdout, without marker) to log, with env added to this
    process's environment; with marker, waits for a stdout line containing it and returns it too."""
    out = open(log, "w")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if marker else out,
                         stderr=out, text=True, env=dict(os.environ, **env) if env else None)
    PROCS.append(p)
    if not marker:
        return p, None
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if marker in line:
            return p, line.strip()
        if p.poll() is not None:
            break
    sys.exit(f"{cmd[0]} did not start; see {log}")


def stop_all():
    """Stops every process start() started: SIGTERM, then SIGKILL after 5 s."""
    for p in PROCS:
        if p.poll() is None:
            p.terminate()
    for p in PROCS:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port():
    """A port free on 127.0.0.1 now, for a program that cannot bind port 0 and print its choice."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_pids(pid):
    """pid and its descendants (from /proc/PID/task/TID/children)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return pids


def cpu_ns(pid, threads=None, exclude=False):
    """CPU time of pid's process tree so far, ns: the sum of its threads' /proc schedstat run times.
    threads (a set of thread names, /proc/.../comm): only those threads, or with exclude all but those."""
    total = 0
    for p in tree_pids(pid):
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                if threads is not None:
                    with open(f"/proc/{p}/task/{t}/comm") as f:
                        if (f.read().strip() in threads) == exclude:
                            continue
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
    return total


def study_bodies(n, repeats=300, seed=7, stream_tokens=0):
    """n raw HTTP/1.1 requests, POST /v1/completions: ~28 KB prompts (repeats=300) from 8 salted
    families, a new question number per request."""
    rng = random.Random(seed)
    salts = ["".join(rng.choice("0123456789abcdef") for _ in range(256)) for _ in range(8)]
    filler = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n" * repeats
    bodies = []
    for i in range(n):
        f = rng.randrange(8)
        prompt = f"{salts[f]}\nDocument {f}\n{filler}Question {i:06d}: Explain the operational tradeoffs in detail."
        req = {"model": "study", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if stream_tokens:
            req.update(max_tokens=stream_tokens, stream=True, stream_options={"include_usage": True})
        body = json.dumps(req).encode()
        bodies.append(b"POST /v1/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n" % len(body) + body)
    return bodies


class Phase:
    """One phase's outcome: latencies (s), failures (status, exception name, UNROUTED or
    MISROUTED), replicas that answered."""

    def __init__(self):
        self.lat, self.errors, self.replicas = [], [], collections.Counter()


async def one_conn(host, port, reqs, ph, starts=None, routed=False):
    """Sends reqs one after the other over one keep-alive connection (at starts[i] if given).
    A failure (a status other than 200, a broken connection; with routed, a 200 without kvroute's
    target-pod response header or from another replica than it names) is recorded, never raised;
    a broken connection fails its remaining requests."""
    done = 0
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, req in enumerate(reqs):
            if starts:
                delay = starts[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            t = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length, chunked, pod, replica = 0, False, None, None
            for line in head.split(b"\r\n"):
                low = line.lower()
                if low.startswith(b"content-length:"):
                    length = int(line[15:])
                elif low == b"transfer-encoding: chunked":
                    chunked = True
                elif low.startswith(b"x-kvroute-sim-replica:"):
                    replica = line[22:].strip().decode()
                    ph.replicas[replica] += 1
                elif low.startswith(b"target-pod:"):
                    pod = line[11:].strip().decode()
            if chunked:  # SSE: chunks until the last (size 0)
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                await reader.readexactly(length)
            ph.lat.append(time.perf_counter() - t)
            done += 1
            if status != 200:
                ph.errors.append(status)
            elif routed and pod is None:
                ph.errors.append(UNROUTED)
            elif routed and pod != replica:
                ph.errors.append(MISROUTED)
        writer.close()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
        ph.errors += [type(e).__name__] * (len(reqs) - done)


async def run_phase(addr, bodies, count, conc, offset, rate=None, timeout=120.0, routed=False):
    """count requests (rounded down to a multiple of conc, at least conc) over conc connections:
    closed loop, or open loop at rate requests/s (connection c sends its i-th request at
    t0 + (i * conc + c) / rate, or at once if late). Requests not answered within timeout
    seconds are failures; with routed, so is a 200 without a target-pod header (a request
    kvroute did not route) or from another replica than it names. Returns (Phase, wall seconds)."""
    host, port = addr.rsplit(":", 1)
    ph = Phase()
    per = max(1, count // conc)
    chunks = [[bodies[(offset + c * per + i) % len(bodies)] for i in range(per)] for c in range(conc)]
    t0 = time.perf_counter()
    starts = [[t0 + (i * conc + c) / rate for i in range(per)] for c in range(conc)] if rate else [None] * conc
    tasks = [asyncio.ensure_future(one_conn(host, int(port), ch, ph, starts[c], routed)) for c, ch in enumerate(chunks)]
    _, late = await asyncio.wait(tasks, timeout=timeout)
    if late:
        for t in late:
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        broken = sum(isinstance(e, str) and e not in (UNROUTED, MISROUTED) for e in ph.errors)  # requests of broken connections
        ph.errors += ["timeout"] * (per * conc - len(ph.lat) - broken)
    return ph, time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
