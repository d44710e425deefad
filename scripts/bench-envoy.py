#!/usr/bin/env python3
"""Bounded load benchmark: what kvroute-ext-proc costs in front of two kvroute-sim replicas.

One Envoy process (--concurrency 1), the same two replicas, four listeners:
  rr        Envoy alone, ROUND_ROBIN over the two replicas (no ext_proc)
  floor     Envoy + the protocol floor (ext-proc/examples/floor.rs: the same tonic stack and
            replies, round-robin, no parsing or routing), response-headers phase SEND
  kv        Envoy + kvroute-ext-proc, prefix-cache, response-headers phase SEND (default)
  kv-nohdr  Envoy + kvroute-ext-proc, prefix-cache, response-headers phase SKIP
Every listener is envoy/envoy.template.yaml's, rendered by `kvroute-ext-proc envoy-config`
(BUFFERED request body, response trailers SEND, metadata routing, the round-robin fallback
route) under its own name and ext_proc cluster; rr is the same listener without the ext_proc
filter. Requests are study-shaped: ~28 KB prompts
from 8 salted families, a new question number per request, non-streaming, max_tokens 1, the
replicas at a large speed-up so that the engine time is small and constant.

With --stream-tokens N the requests stream (SSE, N tokens, usage included) and the last
listener is kv-untimed instead of kv-nohdr: a second kvroute-ext-proc with
[stream_timing] max_streams = 0, so that "kv vs kv-untimed" is what timing a few responses
through kvroute (response body STREAMED by mode_override, one gRPC message per chunk) costs.

Each phase sends a fixed number of requests with an asyncio client over keep-alive
connections, in three load shapes: "c=1" (closed loop, one connection: latency with an idle
machine), "N/s" (open loop at a fixed moderate rate over 8 connections, --rate, default
1000 requests/s: well under every listener's capacity) and "c=8" (closed loop, 8 connections:
saturation, every process competes for the 2 cores, so latency there is mostly CPU queueing);
phases are interleaved over rounds. CPU is read from /proc/<pid>/task/*/schedstat around each phase.
Prints a table per (listener, load shape) and the added p50/p99 of kv vs rr (medians over
rounds). Everything runs on 127.0.0.1 with ports chosen at run time and stops on exit.
Numbers are relative: client, Envoy, kvroute and replicas share the machine's cores.
"""
import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVROUTE_BIN_DIR") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release")
ENVOY = os.environ.get("ENVOY_BIN") or os.path.join(ROOT, ".venv", "bin", "envoy")

PROCS = []


def start(cmd, log, marker=None, timeout=30.0):
    """Starts cmd (stderr to log); with marker, waits for a stdout line containing it."""
    err = open(log, "w")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if marker else subprocess.DEVNULL,
                         stderr=err, text=True)
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
    for p in PROCS:
        if p.poll() is None:
            p.terminate()
    for p in PROCS:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cpu_ns(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def render(kv_config, grpc_addr, response_headers):
    """`kvroute-ext-proc envoy-config`: envoy/envoy.template.yaml for an ext_proc server at
    grpc_addr (listener and admin on free ports), as text."""
    cmd = [os.path.join(BIN, "kvroute-ext-proc"), "--config", kv_config, "--grpc-listen", grpc_addr,
           "envoy-config", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    if not response_headers:
        cmd.append("--no-response-headers")
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def split_config(text):
    """A rendered config's (head up to its listeners, its one listener, {cluster name: item}),
    cut at the template's section lines; each cluster item starts with '  - name: NAME'."""
    head, rest = text.split("\n  listeners:\n", 1)
    listener, clusters = rest.split("\n  clusters:\n", 1)
    items = re.split(r"(?m)^(?=  - name: )", clusters)
    return head, listener, {i.split("\n", 1)[0].split(": ", 1)[1].strip(): i.rstrip("\n") for i in items if i.strip()}


def envoy_config(kv_config, ext_addr, floor_addr, untimed_addr=None):
    """One Envoy with the bench's listeners, each the shipped template's listener (rendered
    by kvroute-ext-proc) under its own name and ext_proc cluster; rr is that listener without
    the ext_proc filter (no metadata, so every request takes the template's round-robin
    fallback route)."""
    last = ("kv-untimed", untimed_addr, True) if untimed_addr else ("kv-nohdr", ext_addr, False)
    listeners, clusters, head = [], [], None
    for name, addr, headers in [("kv", ext_addr, True), ("floor", floor_addr, True), last]:
        h, listener, items = split_config(render(kv_config, addr, headers))
        if head is None:
            head = h
            clusters += [items["kvroute_pods"], items["kvroute_fallback"]]
            no_filter = re.sub(r"(?ms)^          - name: envoy\.filters\.http\.ext_proc\n.*?(?=^          - name: )",
                               "", listener, count=1)
            assert "ext_proc" not in no_filter.split("http_filters:", 1)[1], "rr still has the ext_proc filter"
            listeners.append(no_filter.replace("kvroute_gateway", "rr"))
        cluster = f"ext_{name}"
        listeners.append(listener.replace("kvroute_gateway", name).replace("kvroute_ext_proc", cluster))
        clusters.append(items["kvroute_ext_proc"].replace("kvroute_ext_proc", cluster))
    return head + "\n  listeners:\n" + "\n".join(listeners) + "\n  clusters:\n" + "\n".join(clusters) + "\n"


def study_bodies(n, repeats=300, seed=7, stream_tokens=0):
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


async def one_conn(host, port, reqs, lat, errors, starts=None):
    reader, writer = await asyncio.open_connection(host, port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(__import__("socket").IPPROTO_TCP, __import__("socket").TCP_NODELAY, 1)
    for i, req in enumerate(reqs):
        if starts:
            delay = starts[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        t = time.perf_counter()
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length, chunked = 0, False
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            elif line.lower() == b"transfer-encoding: chunked":
                chunked = True
        if chunked:  # SSE: chunks until the last (size 0)
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            await reader.readexactly(length)
        lat.append(time.perf_counter() - t)
        if status != 200:
            errors.append(status)
    writer.close()


async def run_phase(addr, bodies, count, conc, offset, rate=None):
    """count requests over conc connections: closed loop, or open loop at rate requests/s
    (connection c sends its i-th request at t0 + (i * conc + c) / rate, or at once if late)."""
    host, port = addr.rsplit(":", 1)
    lat, errors = [], []
    per = count // conc
    chunks = [[bodies[(offset + c * per + i) % len(bodies)] for i in range(per)] for c in range(conc)]
    t0 = time.perf_counter()
    starts = None
    if rate:
        starts = [[t0 + (i * conc + c) / rate for i in range(per)] for c in range(conc)]
    await asyncio.gather(*(one_conn(host, int(port), ch, lat, errors, starts and starts[c])
                           for c, ch in enumerate(chunks)))
    return lat, errors, time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=800, help="requests per phase at concurrency 1")
    ap.add_argument("--load-requests", type=int, default=2400, help="requests per phase at concurrency 8")
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop rate of the moderate-load phase, requests/s")
    ap.add_argument("--rate-requests", type=int, default=2400, help="requests per open-loop phase")
    ap.add_argument("--speedup", type=float, default=10000.0)
    ap.add_argument("--repeats", type=int, default=300, help="filler sentences per prompt (300 = the study's ~28 KB)")
    ap.add_argument("--ext-workers", type=int, default=1, help="kvroute-ext-proc tokio worker threads")
    ap.add_argument("--stream-tokens", type=int, default=0,
                    help="stream N tokens per response (SSE) and compare kv against kv-untimed (0: max_tokens 1, no stream)")
    args = ap.parse_args()
    floor_bin = os.path.join(BIN, "examples", "floor")
    for b in (os.path.join(BIN, "kvroute-ext-proc"), os.path.join(BIN, "kvroute-sim"), floor_bin, ENVOY):
        if not os.access(b, os.X_OK):
            sys.exit(f"missing {b} (run: make bench-envoy)")
    work = tempfile.mkdtemp(prefix="kvroute-bench.")
    try:
        sims = []
        for name in ("replica-a", "replica-b"):
            p, line = start([os.path.join(BIN, "kvroute-sim"), "serve", "--host", "127.0.0.1", "--port", "0",
                             "--name", name, "--speedup", str(args.speedup)], f"{work}/{name}.log", "listening on")
            sims.append((name, line.replace("listening on ", ""), p))
        cfg = f"{work}/kvroute.toml"
        with open(cfg, "w") as f:
            pods = ", ".join(f'{{ name = "{n}", address = "{a}" }}' for n, a, _ in sims)
            f.write(f'[listen]\ngrpc = "127.0.0.1:0"\nadmin = "127.0.0.1:0"\n'
                    f'[routing]\ndefault_strategy = "prefix-cache"\n[models.study]\npods = [{pods}]\n')
        ext, line = start([os.path.join(BIN, "kvroute-ext-proc"), "--config", cfg, "--log", "warn",
                           "--workers", str(args.ext_workers)],
                          f"{work}/ext-proc.log", "listening grpc=")
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        untimed, untimed_fields = None, None
        if args.stream_tokens:
            with open(f"{work}/untimed.toml", "w") as f:
                f.write(open(cfg).read() + "[stream_timing]\nmax_streams = 0\n")
            untimed, uline = start([os.path.join(BIN, "kvroute-ext-proc"), "--config", f"{work}/untimed.toml",
                                    "--log", "warn", "--workers", str(args.ext_workers)],
                                   f"{work}/untimed.log", "listening grpc=")
            untimed_fields = dict(w.split("=", 1) for w in uline.split() if "=" in w)
        floor, fline = start([floor_bin] + [a for _, a, _ in sims], f"{work}/floor.log", "floor listening")
        floor_addr = fline.split("grpc=", 1)[1]
        ecfg = f"{work}/envoy.yaml"
        with open(ecfg, "w") as f:
            f.write(envoy_config(cfg, fields["grpc"], floor_addr, untimed_fields and untimed_fields["grpc"]))
        envoy, _ = start([ENVOY, "-c", ecfg, "--admin-address-path", f"{work}/admin", "--concurrency", "1",
                          "--base-id", str(9000 + os.getpid() % 1000), "-l", "warning"], f"{work}/envoy.log")
        for _ in range(300):
            if os.path.exists(f"{work}/admin") and open(f"{work}/admin").read().strip():
                break
            time.sleep(0.1)
        admin = open(f"{work}/admin").read().strip()
        for _ in range(300):
            try:
                if urllib.request.urlopen(f"http://{admin}/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        st = json.load(urllib.request.urlopen(f"http://{admin}/listeners?format=json"))["listener_statuses"]
        ports = {s["name"]: f"127.0.0.1:{s['local_address']['socket_address']['port_value']}" for s in st}

        bodies = study_bodies(4096, args.repeats, stream_tokens=args.stream_tokens)
        kind = f"streaming {args.stream_tokens} tokens" if args.stream_tokens else "max_tokens 1"
        print(f"body size {len(bodies[0])} bytes, {kind}; replicas at speed-up {args.speedup:g}; "
              f"{args.rounds} rounds x (c=1: {args.requests}, {args.rate:g}/s: {args.rate_requests}, "
              f"c=8: {args.load_requests}) requests per listener")
        shapes = [("c=1", 1, args.requests, None), (f"{args.rate:g}/s", 8, args.rate_requests, args.rate),
                  ("c=8", 8, args.load_requests, None)]
        last = "kv-untimed" if untimed else "kv-nohdr"
        names = ["rr", "floor", "kv", last]
        for n in names:  # warm-up: connections, index, allocator
            asyncio.run(run_phase(ports[n], bodies, 200, 4, 0))
        results = {}
        offset = 0
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                side = {"floor": floor, "kv-untimed": untimed}.get(n, ext)
                for shape, conc, count, rate in shapes:
                    e0, x0 = cpu_ns(envoy.pid), cpu_ns(side.pid)
                    lat, errors, wall = asyncio.run(run_phase(ports[n], bodies, count, conc, offset, rate))
                    e1, x1 = cpu_ns(envoy.pid), cpu_ns(side.pid)
                    offset += count
                    done = len(lat)
                    results.setdefault((n, shape), []).append({
                        "p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3, "rps": done / wall,
                        "envoy_us": (e1 - e0) / 1e3 / done, "ext_us": (x1 - x0) / 1e3 / done, "errors": len(errors)})
        med = lambda rows, k: statistics.median(x[k] for x in rows)
        print()
        print("| listener | load | p50 ms | p99 ms | req/s | Envoy CPU µs/req | ext_proc CPU µs/req | errors |")
        print("|---|---|---|---|---|---|---|---|")
        for n in names:
            for shape, *_ in shapes:
                rows = results[(n, shape)]
                print(f"| {n} | {shape} | {med(rows, 'p50'):.3f} | {med(rows, 'p99'):.3f} | {med(rows, 'rps'):.0f} | "
                      f"{med(rows, 'envoy_us'):.0f} | {med(rows, 'ext_us'):.0f} | {sum(x['errors'] for x in rows)} |")
        print()
        print("Added by the ext_proc server vs Envoy round-robin alone (medians over rounds):")
        for n in ("floor", "kv", last):
            for shape, *_ in shapes:
                a, b = results[(n, shape)], results[("rr", shape)]
                print(f"  {n:8s} {shape:>7s}: p50 {med(a, 'p50') - med(b, 'p50'):+.3f} ms, "
                      f"p99 +{med(a, 'p99') - med(b, 'p99'):.3f} ms, req/s {med(a, 'rps'):.0f} vs {med(b, 'rps'):.0f}, "
                      f"Envoy CPU +{med(a, 'envoy_us') - med(b, 'envoy_us'):.0f} µs/req, "
                      f"ext_proc CPU {med(a, 'ext_us'):.0f} µs/req")
        def versus(title, n, base):
            print(f"{title} (medians over rounds):")
            for shape, *_ in shapes:
                a, b = results[(n, shape)], results[(base, shape)]
                print(f"  {shape:>7s}: p50 {med(a, 'p50') - med(b, 'p50'):+.3f} ms, "
                      f"p99 {med(a, 'p99') - med(b, 'p99'):+.3f} ms, req/s {med(a, 'rps'):.0f} vs {med(b, 'rps'):.0f}, "
                      f"ext_proc CPU {med(a, 'ext_us'):.0f} vs {med(b, 'ext_us'):.0f} µs/req "
                      f"({med(a, 'ext_us') - med(b, 'ext_us'):+.0f}), "
                      f"Envoy CPU {med(a, 'envoy_us'):.0f} vs {med(b, 'envoy_us'):.0f} µs/req")

        versus("kvroute-ext-proc (response headers on) vs the protocol floor: kvroute's own work", "kv", "floor")
        if untimed:
            versus("kvroute timing a few streamed responses (kv) vs not (kv-untimed)", "kv", "kv-untimed")
        print()
        for label, f in (("kvroute", fields), ("kvroute untimed", untimed_fields)):
            if not f:
                continue
            metrics = urllib.request.urlopen(f"http://{f['admin']}/metrics").read().decode()
            value = lambda prefix: sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith(prefix))
            print(f"{label}: in-flight after the run {value('kvroute_pod_in_flight{'):g} (must be 0), "
                  f"responses timed {value('kvroute_timed_responses_total'):g}")
    finally:
        stop_all()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
