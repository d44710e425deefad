#!/usr/bin/env python3
"""Bounded load benchmark: what kvroute costs in front of two kvroute-sim replicas, as
kvroute-ext-proc behind Envoy and as the dynamic module inside Envoy, next to Envoy alone,
sglang-router's cache-aware policy and no router at all.

Targets (--targets, comma-separated; each one is an entry of TARGETS below):
  rr          Envoy alone, ROUND_ROBIN over the two replicas (no ext_proc). Not streaming: the
              template's fallback route turns its buffer filter on, so Envoy reads the whole
              body before it picks a replica (as for ext_proc and the module)
  buf         Envoy alone, ROUND_ROBIN, with Envoy's own envoy.filters.http.buffer on for every
              route (max_request_bytes and the listener's buffer limit the module listener's) and
              no other filter: "mod vs buf" is the module's own cost apart from buffering
  stream      Envoy alone, ROUND_ROBIN, no buffer filter at all: the body streams to the replica
              ("buf vs stream" is what buffering a 28 KB body costs Envoy)
  floor       Envoy + the protocol floor (ext-proc/examples/floor.rs: the same tonic stack and
              replies, round-robin, no parsing or routing), response-headers phase SEND
  kv          Envoy + kvroute-ext-proc, prefix-cache, response-headers phase SEND (default)
  kv-nohdr    Envoy + kvroute-ext-proc, prefix-cache, response-headers phase SKIP
  kv-untimed  Envoy + a second kvroute-ext-proc with [stream_timing] max_streams = 0 (with
              --stream-tokens, "kv vs kv-untimed" is what timing a few streamed responses costs)
  mod         Envoy with kvroute inside it: the dynamic module libkvroute_envoy.so (crate
              envoy-module/, `cargo build --release -p kvroute-envoy`), prefix-cache, reading the
              same kvroute TOML file as kv; no second process
  sg          sglang-router 0.3.2 (PyPI sglang-router==0.3.2, installed into .venv-bench/ if
              missing), `python -m sglang_router.launch_router --policy cache_aware` in front of
              the same replicas, --log-level warn (Envoy and kvroute log at warning too)
  direct      no router: the client straight to replica-a (the reference for added latency)
The Envoy targets are listeners of one Envoy process (--concurrency 1), each
envoy/envoy.template.yaml's listener rendered by `kvroute-ext-proc envoy-config` (BUFFERED
request body, response trailers SEND, metadata routing, the round-robin fallback route) under
its own name and ext_proc cluster; rr is the same listener without the ext_proc filter (its
disabled buffer filter still on at the fallback route), stream that without the buffer filter and
the fallback route's setting for it, buf stream with the buffer filter on for all routes. mod is
envoy/envoy.module.template.yaml's listener rendered by `kvroute-ext-proc envoy-module-config`
(the dynamic_modules filter and its routes; filter_config the TOML's path) under its own
name, routing to that template's ORIGINAL_DST cluster as "mod_pods"; Envoy then runs with
ENVOY_DYNAMIC_MODULES_SEARCH_PATH=<the release directory> and KVROUTE_LOG=warn (plus the module's
start-up line, which names its kvroute admin listener). One Envoy rather than two: phases run
one at a time, so the one worker thread serves only the measured listener, rr and mod are
measured on the very same Envoy worker, and the module's only other cost in the process, its
own thread (kvroute's admin listener, timers, file reload), is counted apart (below).
A target's CPU is the CPU of the processes it names (their whole process trees, from
/proc/<pid>/task/*/schedstat, read around each phase): rr, buf, stream Envoy; floor and kv Envoy + their
ext_proc server; mod Envoy (whose worker runs the filter) + the module's thread "kvroute" in
Envoy (group "module"; with mod loaded, the other Envoy targets' "envoy" leaves that thread
out), that is the whole Envoy process; sg the sglang-router process; direct nothing. The
replicas' CPU is shown apart.

Every response of kv, kv-untimed and mod must carry kvroute's target-pod header naming the
replica that answered (else the request counts as failed: "200 without target-pod", "target-pod
is not the replica that answered"), and after the run each kvroute (each
kvroute-ext-proc, the module) must show in-flight 0 and kvroute_routed_total equal to the
responses its targets got, warm-up included (its /metrics; the module's admin address comes from
its start-up line on Envoy's stderr). If the module does not load or start, the bench stops
before measuring.

Requests are study-shaped: ~28 KB prompts from 8 salted families, a new question number per
request, non-streaming, max_tokens 1 (--stream-tokens N: SSE, N tokens, usage included), the
replicas at a large speed-up so that the engine time is small and constant. Each phase sends a
fixed number of requests with an asyncio client over keep-alive connections, in the load shapes
of --shapes: "c=N" is a closed loop over N connections (c=1: latency with an idle machine;
c=32: saturation, every process competes for the 2 cores, so latency there is mostly CPU
queueing), "R/s" an open loop at R requests/s over 8 connections. Phases are interleaved over
rounds (the target order rotates each round). Prints a table per (target, load shape), the
differences between targets and issue #19's three ratios for kv and mod, as medians over rounds
(a ratio is the median of its per-round ratios). Exits 1 if any request failed or a kvroute's
counts are off. Everything runs on 127.0.0.1 with ports chosen at run time and stops on exit
(also on Ctrl-C or SIGTERM). Numbers are relative: client, routers and replicas share the
machine's cores.

--smoke: one round of a few requests (c=1 and c=32) through rr, buf, kv and mod only: a quick check
that the bench and the listeners work, well under a minute.
`make bench-envoy` builds the release binaries and the module and runs this; BENCH_ARGS="..."
passes options.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from bench_load import MISROUTED, UNROUTED, cpu_ns, free_port, pct, run_phase, start, stop_all, study_bodies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KVROUTE_BIN_DIR") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release")
ENVOY = os.environ.get("ENVOY_BIN") or os.path.join(ROOT, ".venv", "bin", "envoy")
BENCH_VENV = os.environ.get("BENCH_VENV") or os.path.join(ROOT, ".venv-bench")
SGLANG_ROUTER = "0.3.2"
MODULE = "libkvroute_envoy.so"  # the dynamic module (crate envoy-module/), found in BIN
MODULE_THREADS = {"kvroute"}  # the module's own thread in Envoy (envoy-module/src/instance.rs)


def render(kv_config, grpc_addr, response_headers):
    """`kvroute-ext-proc envoy-config`: envoy/envoy.template.yaml for an ext_proc server at
    grpc_addr (listener and admin on free ports), as text."""
    cmd = [os.path.join(BIN, "kvroute-ext-proc"), "--config", kv_config, "--grpc-listen", grpc_addr,
           "envoy-config", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    if not response_headers:
        cmd.append("--no-response-headers")
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def render_module(kv_config):
    """`kvroute-ext-proc envoy-module-config`: envoy/envoy.module.template.yaml with kvroute's
    TOML file kv_config as the filter's configuration (listener and admin on free ports), as text."""
    cmd = [os.path.join(BIN, "kvroute-ext-proc"), "--config", kv_config,
           "envoy-module-config", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def split_config(text):
    """A rendered config's (head up to its listeners, its one listener, {cluster name: item}),
    cut at the template's section lines; each cluster item starts with '  - name: NAME'."""
    head, rest = text.split("\n  listeners:\n", 1)
    listener, clusters = rest.split("\n  clusters:\n", 1)
    items = re.split(r"(?m)^(?=  - name: )", clusters)
    return head, listener, {i.split("\n", 1)[0].split(": ", 1)[1].strip(): i.rstrip("\n") for i in items if i.strip()}


BUFFER_FILTER = re.compile(r"(?ms)^          - name: envoy\.filters\.http\.buffer\b.*?(?=^          - name: )")


def envoy_alone(listener, kind, limit):
    """The ext_proc template's listener without ext_proc (kind None: as rendered, its buffer filter
    on at the fallback route), without any buffer filter ("stream"), or with the buffer filter
    on for every route at limit bytes and the listener's buffer limit limit ("buffer")."""
    if kind is None:
        return listener
    n = len(BUFFER_FILTER.findall(listener))
    assert n == 1, f"{n} buffer filters in the listener"
    listener = BUFFER_FILTER.sub("", listener)
    # The fallback route (every bench request takes it): its typed_per_filter_config holds only
    # the buffer filter's setting, which turns the disabled filter on there; dropped.
    start = listener.index("              - name: kvroute_fallback\n")
    end = listener.index("              - name: kvroute_fallback_models\n")
    route = listener[start:end]
    cut = route.index("                typed_per_filter_config:\n")
    assert set(re.findall(r"(?m)^                  (\S+):", route[cut:])) == {"envoy.filters.http.buffer"}, route
    listener = listener[:start] + route[:cut] + listener[end:]
    if kind == "buffer":
        router = "          - name: envoy.filters.http.router\n"
        assert listener.count(router) == 1
        listener = listener.replace(router, (
            "          - name: envoy.filters.http.buffer             # every route: Envoy buffers every body\n"
            "            typed_config:\n"
            '              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer\n'
            f"              max_request_bytes: {limit}\n") + router)
        listener, n = re.subn(r"(?m)^(    per_connection_buffer_limit_bytes: )\d+$", rf"\g<1>{limit}", listener)
        assert n == 1, "no per_connection_buffer_limit_bytes in the listener"
    filters = re.findall(r"(?m)^          - name: (\S+)", listener.split("http_filters:", 1)[1])
    assert filters == (["envoy.filters.http.buffer"] if kind == "buffer" else []) + ["envoy.filters.http.router"], filters
    return listener


def envoy_config(kv_config, listeners):
    """One Envoy with the given listeners [(name, an ext_proc gRPC address, "module", "buffer",
    "stream" or None, response headers SEND)], each the shipped template's listener (rendered by
    kvroute-ext-proc) under its own name and ext_proc cluster; without an ext_proc address, that
    listener without the ext_proc filter (no metadata, so every request takes the template's
    round-robin fallback route), with "stream" also without the buffer filter, with "buffer"
    with the buffer filter on for every route instead (envoy_alone); with "module", the shipped
    module template's listener (envoy-module-config: the dynamic_modules filter reading kv_config,
    and its routes) under its own name, with the module template's ORIGINAL_DST cluster as
    NAME_pods (it has no ext_proc or fallback cluster)."""
    out, clusters, head, shared = [], [], None, False
    limit = None  # the module listener's buffer limit, for "buffer"
    if any(g == "buffer" for _, g, _ in listeners):
        m = re.findall(r"(?m)^    per_connection_buffer_limit_bytes: (\d+)$", split_config(render_module(kv_config))[1])
        assert len(m) == 1, f"the module listener's buffer limit: {m}"
        limit = int(m[0])
    for name, grpc, headers in listeners:
        if grpc == "module":
            h, listener, items = split_config(render_module(kv_config))
            assert "envoy.filters.http.dynamic_modules" in listener and json.dumps(kv_config) in listener, \
                f"{name}: not the module listener reading {kv_config}:\n{listener}"
            assert set(items) == {"kvroute_pods"}, f"{name}: the module template's clusters are {sorted(items)}"
            head, cluster = head or h, f"{name}_pods"
            out.append(listener.replace("kvroute_gateway", name).replace("kvroute_pods", cluster))
            clusters.append(items["kvroute_pods"].replace("kvroute_pods", cluster))
            continue
        alone = grpc in (None, "buffer", "stream")
        h, listener, items = split_config(render(kv_config, "127.0.0.1:9" if alone else grpc, headers))
        if not shared:  # the ext_proc template's pods and fallback clusters, once
            head, shared = h, True
            clusters += [items["kvroute_pods"], items["kvroute_fallback"]]
        if alone:
            listener = re.sub(r"(?ms)^          - name: envoy\.filters\.http\.ext_proc\n.*?(?=^          - name: )",
                              "", listener, count=1)
            assert "ext_proc" not in listener.split("http_filters:", 1)[1], f"{name} still has the ext_proc filter"
            out.append(envoy_alone(listener, grpc, limit).replace("kvroute_gateway", name))
            continue
        cluster = f"ext_{name}"
        out.append(listener.replace("kvroute_gateway", name).replace("kvroute_ext_proc", cluster))
        clusters.append(items["kvroute_ext_proc"].replace("kvroute_ext_proc", cluster))
    names = [c.split("\n", 1)[0] for c in clusters]
    assert len(set(names)) == len(names), f"clashing cluster names: {names}"
    return head + "\n  listeners:\n" + "\n".join(out) + "\n  clusters:\n" + "\n".join(clusters) + "\n"


def wait_http(url, ok=lambda body: True, timeout=60.0, what="server", proc=None, log=None):
    """The body of url once it answers 200 and ok(body); exits if it does not within timeout, or
    if proc (the server, when given) has ended (the end of its log shown)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = "".join(open(log).readlines()[-20:]) if log else ""
            sys.exit(f"{what} exited (status {proc.returncode}) before {url} answered; {log} ends:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body = r.read().decode()
                if r.status == 200 and ok(body):
                    return body
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} not ready at {url} after {timeout:g} s")


def sglang_python():
    """.venv-bench's python with sglang-router==0.3.2, creating the venv and installing it if missing."""
    py = os.path.join(BENCH_VENV, "bin", "python")
    version = [py, "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"]
    if os.access(py, os.X_OK) and subprocess.run(version, capture_output=True, text=True).stdout.strip() == SGLANG_ROUTER:
        return py
    print(f"installing sglang-router=={SGLANG_ROUTER} into {BENCH_VENV}", file=sys.stderr)
    if not os.access(py, os.X_OK):
        subprocess.run([sys.executable, "-m", "venv", BENCH_VENV], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", f"sglang-router=={SGLANG_ROUTER}"], check=True)
    return py


class Bench:
    """The processes behind the targets, each started once, on first use. procs maps a name
    to its pids (CPU groups); an Envoy target registers a listener and gets "envoy:NAME" as its
    address, resolved once the one Envoy has started with every registered listener. With the
    module listener, Envoy's CPU group "envoy" leaves out the module's own thread, which is the
    group "module" (so that the module's background work is charged to mod alone)."""

    def __init__(self, args, work):
        self.args, self.work, self.procs, self.listeners = args, work, {}, []
        self.replicas = []  # (name, address)
        for name in ("replica-a", "replica-b"):
            p, line = start([os.path.join(BIN, "kvroute-sim"), "serve", "--host", "127.0.0.1", "--port", "0",
                             "--name", name, "--speedup", str(args.speedup)], f"{work}/{name}.log", "listening on")
            self.replicas.append((name, line.replace("listening on ", "")))
            self.procs.setdefault("replicas", []).append(p.pid)
        self.kv_config = f"{work}/kvroute.toml"
        with open(self.kv_config, "w") as f:
            pods = ", ".join(f'{{ name = "{n}", address = "{a}" }}' for n, a in self.replicas)
            f.write(f'[listen]\ngrpc = "127.0.0.1:0"\nadmin = "127.0.0.1:0"\n'
                    f'[routing]\ndefault_strategy = "prefix-cache"\n[models.study]\npods = [{pods}]\n')
        self.grpc, self.kvroute_admin, self.ports = {}, {}, {}  # ext_proc gRPC and admin addresses, Envoy listeners

    def kvroute(self, name="ext", extra_toml=""):
        """A kvroute-ext-proc (prefix-cache over the replicas), started once per name; its gRPC address."""
        if name not in self.procs:
            cfg = self.kv_config
            if extra_toml:
                cfg = f"{self.work}/{name}.toml"
                with open(cfg, "w") as f:
                    f.write(open(self.kv_config).read() + extra_toml)
            p, line = start([os.path.join(BIN, "kvroute-ext-proc"), "--config", cfg, "--log", "warn",
                             "--workers", str(self.args.ext_workers)], f"{self.work}/{name}.log", "listening grpc=")
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            self.procs[name], self.grpc[name], self.kvroute_admin[name] = [p.pid], fields["grpc"], fields["admin"]
        return self.grpc[name]

    def floor(self):
        """The protocol floor (ext-proc/examples/floor.rs), started once; its gRPC address."""
        if "floor" not in self.procs:
            p, line = start([os.path.join(BIN, "examples", "floor")] + [a for _, a in self.replicas],
                            f"{self.work}/floor.log", "floor listening")
            self.procs["floor"], self.grpc["floor"] = [p.pid], line.split("grpc=", 1)[1]
        return self.grpc["floor"]

    def envoy_listener(self, name, grpc=None, response_headers=True):
        """grpc: an ext_proc server's address, None (Envoy alone), "buffer" (Envoy alone, its buffer
        filter on everywhere), "stream" (Envoy alone, no buffer filter) or "module" (kvroute inside Envoy)."""
        self.listeners.append((name, grpc, response_headers))
        return f"envoy:{name}"

    def module(self, name="mod"):
        """The module's listener (kvroute inside the one Envoy, reading the same kvroute TOML);
        its requests are counted by kvroute instance "module" (admin address known once Envoy runs)."""
        return self.envoy_listener(name, "module")

    def start_envoy(self):
        if not self.listeners:
            return
        ecfg, admin_path, log = f"{self.work}/envoy.yaml", f"{self.work}/admin", f"{self.work}/envoy.log"
        with open(ecfg, "w") as f:
            f.write(envoy_config(self.kv_config, self.listeners))
        module = any(g == "module" for _, g, _ in self.listeners)
        # The module's log: warnings, as kvroute-ext-proc's --log warn, and its start-up line.
        env = {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": BIN, "KVROUTE_LOG": "warn,kvroute_envoy::instance=info"} \
            if module else None
        p, _ = start([ENVOY, "-c", ecfg, "--admin-address-path", admin_path, "--concurrency", "1",
                      "--base-id", str(9000 + os.getpid() % 1000), "-l", "warning"], log, env=env)
        self.procs["envoy"] = [p.pid]
        tail = lambda: "".join(open(log).readlines()[-20:])
        deadline = time.time() + 30
        while not (os.path.exists(admin_path) and open(admin_path).read().strip()):
            if p.poll() is not None or time.time() > deadline:
                sys.exit(f"Envoy did not start (exit status {p.poll()}); {log} ends:\n{tail()}")
            time.sleep(0.1)
        admin = open(admin_path).read().strip()
        wait_http(f"http://{admin}/ready", what="Envoy", proc=p, log=log)
        st = json.load(urllib.request.urlopen(f"http://{admin}/listeners?format=json"))["listener_statuses"]
        self.ports = {s["name"]: f"127.0.0.1:{s['local_address']['socket_address']['port_value']}" for s in st}
        if module:  # loaded and serving: its start-up line on Envoy's stderr names its admin listener
            deadline = time.time() + 10
            while not (m := re.search(r"kvroute module serving admin=(\S+)", open(log).read())):
                if p.poll() is not None or time.time() > deadline:
                    sys.exit(f"the kvroute module did not start in Envoy (no 'kvroute module serving' line); "
                             f"{log} ends:\n{tail()}")
                time.sleep(0.1)
            self.kvroute_admin["module"] = m.group(1)
            wait_http(f"http://{m.group(1)}/metrics", what="the module's admin listener")
            threads = {open(f"/proc/{p.pid}/task/{t}/comm").read().strip() for t in os.listdir(f"/proc/{p.pid}/task")}
            if not MODULE_THREADS <= threads:
                sys.exit(f"no thread named {MODULE_THREADS} in Envoy (threads: {sorted(threads)})")
            self.procs["module"] = [p.pid]

    def cpu(self, group):
        """CPU time of a group's processes so far, ns (Envoy's without the module's thread, "module" that thread)."""
        if group == "module":
            return cpu_ns(self.procs["module"][0], MODULE_THREADS)
        if group == "envoy" and "module" in self.procs:
            return cpu_ns(self.procs["envoy"][0], MODULE_THREADS, exclude=True)
        return sum(cpu_ns(p) for p in self.procs[group])

    def sglang(self):
        """sglang-router 0.3.2, cache_aware, in front of the replicas; its address once both are healthy."""
        py = sglang_python()
        port, metrics = free_port(), free_port()
        p, _ = start([py, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
                      "--worker-urls", *[f"http://{a}" for _, a in self.replicas], "--policy", "cache_aware",
                      "--log-level", "warn", "--shutdown-grace-period-secs", "1"], f"{self.work}/sglang-router.log")
        self.procs["sglang"] = [p.pid]
        wait_http(f"http://127.0.0.1:{port}/readiness", lambda b: json.loads(b).get("healthy_workers") == 2,
                  what="sglang-router")
        return f"127.0.0.1:{port}"

    def addr(self, spec):
        return self.ports[spec[6:]] if spec.startswith("envoy:") else spec


# A target is a name, how to start what it needs (a Bench method, on first use; it returns the
# address to load, or Bench.envoy_listener's for a listener of the shared Envoy), the CPU groups
# (Bench.procs names) whose CPU is its own, and the kvroute instance that routes its requests
# (Bench.kvroute_admin's name; its /metrics must count each of them once) with whether every
# response must carry kvroute's target-pod header. Another target is a Bench method that starts
# its process(es), records their pids in self.procs["..."] and returns the address, plus one
# line here and its rows in RATIOS.
@dataclass
class Target:
    setup: Callable[[Bench], str]  # starts what the target needs; its address (or Bench.envoy_listener's)
    cpu: tuple  # Bench.procs names whose CPU is the target's
    kvroute: str = None  # the kvroute instance (Bench.kvroute_admin) routing its requests
    routed: bool = False  # a 200 without a target-pod header naming the replica that answered is a failure


TARGETS = {
    "rr": Target(lambda b: b.envoy_listener("rr"), ("envoy",)),
    "buf": Target(lambda b: b.envoy_listener("buf", "buffer"), ("envoy",)),
    "stream": Target(lambda b: b.envoy_listener("stream", "stream"), ("envoy",)),
    "floor": Target(lambda b: b.envoy_listener("floor", b.floor()), ("envoy", "floor")),
    "kv": Target(lambda b: b.envoy_listener("kv", b.kvroute()), ("envoy", "ext"), "ext", True),
    "kv-nohdr": Target(lambda b: b.envoy_listener("kv-nohdr", b.kvroute(), False), ("envoy", "ext"), "ext"),
    "kv-untimed": Target(lambda b: b.envoy_listener("kv-untimed", b.kvroute("untimed", "[stream_timing]\nmax_streams = 0\n")),
                         ("envoy", "untimed"), "untimed", True),
    "mod": Target(lambda b: b.module(), ("envoy", "module"), "module", True),
    "sg": Target(lambda b: b.sglang(), ("sglang",)),
    "direct": Target(lambda b: b.replicas[0][1], ()),
}

# Issue #19's targets (a) CPU/req ≤ 1.3x Envoy alone's, (b) p50 at most 0.1 ms over Envoy alone's
# at c=1, (c) total CPU/req ≤ 0.8x sglang-router's, for kv and mod; then other differences worth
# a look: (label, a, b, metric, "/" or "-").
RATIOS = [
    ("(a) kv CPU/req ÷ rr CPU/req", "kv", "rr", "cpu", "/"),
    ("(b) kv p50 − rr p50, ms", "kv", "rr", "p50", "-"),
    ("(c) kv total CPU/req ÷ sg total CPU/req", "kv", "sg", "cpu", "/"),
    ("(a) mod CPU/req ÷ rr CPU/req", "mod", "rr", "cpu", "/"),
    ("(b) mod p50 − rr p50, ms", "mod", "rr", "p50", "-"),
    ("(c) mod total CPU/req ÷ sg total CPU/req", "mod", "sg", "cpu", "/"),
    ("mod CPU/req ÷ kv CPU/req", "mod", "kv", "cpu", "/"),
    ("mod p50 − kv p50, ms", "mod", "kv", "p50", "-"),
    # The module without Envoy's buffering (rr buffers too, so buf ≈ rr; stream does not).
    ("mod CPU/req ÷ buf CPU/req", "mod", "buf", "cpu", "/"),
    ("mod p50 − buf p50, ms", "mod", "buf", "p50", "-"),
    ("mod CPU/req − buf CPU/req, µs", "mod", "buf", "cpu", "-"),
    ("buf CPU/req ÷ rr CPU/req", "buf", "rr", "cpu", "/"),
    ("buf CPU/req ÷ stream CPU/req", "buf", "stream", "cpu", "/"),
    ("buf p50 − stream p50, ms", "buf", "stream", "p50", "-"),
    ("mod CPU/req − rr CPU/req, µs", "mod", "rr", "cpu", "-"),
    ("kv CPU/req − rr CPU/req, µs", "kv", "rr", "cpu", "-"),
    ("mod p50 − direct p50, ms", "mod", "direct", "p50", "-"),
    ("kv p50 − sg p50, ms", "kv", "sg", "p50", "-"),
    ("kv p50 − direct p50, ms", "kv", "direct", "p50", "-"),
    ("sg p50 − direct p50, ms", "sg", "direct", "p50", "-"),
    ("rr p50 − direct p50, ms", "rr", "direct", "p50", "-"),
    ("floor p50 − rr p50, ms", "floor", "rr", "p50", "-"),
    ("kv-nohdr p50 − rr p50, ms", "kv-nohdr", "rr", "p50", "-"),
    ("kv-nohdr CPU/req ÷ rr CPU/req", "kv-nohdr", "rr", "cpu", "/"),
    ("kv p50 − floor p50, ms", "kv", "floor", "p50", "-"),
    ("kv CPU/req − floor CPU/req, µs", "kv", "floor", "cpu", "-"),
    ("kv p50 − kv-untimed p50, ms", "kv", "kv-untimed", "p50", "-"),
    ("kv CPU/req − kv-untimed CPU/req, µs", "kv", "kv-untimed", "cpu", "-"),
]


def parse_shapes(text, args):
    """"c=1,c=32,1000/s" -> [(label, connections, requests, rate or None)]."""
    shapes = []
    for s in text.split(","):
        if s.startswith("c="):
            conc = int(s[2:])
            shapes.append((s, conc, args.requests if conc == 1 else args.load_requests, None))
        elif s.endswith("/s"):
            shapes.append((s, 8, args.rate_requests, float(s[:-2])))
        else:
            sys.exit(f"bad load shape {s!r}: c=N or R/s")
    return shapes


def measure(bench, targets, shapes, bodies, rounds, answered):
    """Every (target, shape) phase once per round; {(target, shape): [row per round]}. Adds the
    responses to answered[kvroute instance]."""
    results, offset = {}, 0
    for r in range(rounds):
        order = targets[r % len(targets):] + targets[:r % len(targets)]
        for name, addr in order:
            groups = TARGETS[name].cpu + ("replicas",)
            for shape, conc, count, rate in shapes:
                before = {g: bench.cpu(g) for g in groups}
                ph, wall = asyncio.run(run_phase(addr, bodies, count, conc, offset, rate, routed=TARGETS[name].routed))
                used = {g: bench.cpu(g) - before[g] for g in groups}
                offset += count
                if TARGETS[name].kvroute:
                    answered[TARGETS[name].kvroute] += len(ph.lat)
                n = max(1, len(ph.lat))
                parts = {g: used[g] / 1e3 / n for g in TARGETS[name].cpu}
                results.setdefault((name, shape), []).append({
                    "p50": pct(ph.lat, 0.5) * 1e3, "p99": pct(ph.lat, 0.99) * 1e3, "rps": len(ph.lat) / wall,
                    "cpu": sum(parts.values()), "parts": parts, "replicas_us": used["replicas"] / 1e3 / n,
                    "split": ph.replicas, "errors": ph.errors})
    return results


def report(results, names, shapes):
    med = lambda rows, k: statistics.median(x[k] for x in rows)
    print("\n| target | load | p50 ms | p99 ms | req/s | CPU µs/req | of which | replicas CPU µs/req | replica split | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in names:
        for shape, *_ in shapes:
            rows = results[(n, shape)]
            parts = " + ".join(f"{g} {statistics.median(x['parts'][g] for x in rows):.0f}" for g in TARGETS[n].cpu)
            split = sum((x["split"] for x in rows), Counter())
            split = " / ".join(f"{k[-1]} {v * 100 / max(1, sum(split.values())):.0f}%" for k, v in sorted(split.items()))
            print(f"| {n} | {shape} | {med(rows, 'p50'):.3f} | {med(rows, 'p99'):.3f} | {med(rows, 'rps'):.0f} | "
                  f"{med(rows, 'cpu'):.0f} | {parts or '-'} | {med(rows, 'replicas_us'):.0f} | {split} | "
                  f"{sum(len(x['errors']) for x in rows)} |")
    print("\nDifferences (median over rounds of the per-round value [min .. max]; CPU is each target's total per request):")
    for label, a, b, metric, op in RATIOS:
        if a not in names or b not in names:
            continue
        cells = []
        for shape, *_ in shapes:
            pairs = zip(results[(a, shape)], results[(b, shape)])
            vals = [x[metric] / y[metric] if op == "/" else x[metric] - y[metric] for x, y in pairs]
            fmt = "{:.2f}x" if op == "/" else "{:+.3f}" if metric == "p50" else "{:+.0f}"
            cells.append(f"{shape} " + fmt.format(statistics.median(vals))
                         + (f" [{fmt.format(min(vals))} .. {fmt.format(max(vals))}]" if len(vals) > 1 else ""))
        print(f"  {label:40s} " + ", ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", help=f"comma-separated, of {','.join(TARGETS)} (default: rr,buf,floor,kv,mod,sg,direct; "
                                      "with --stream-tokens kv-untimed too; with --smoke rr,buf,kv,mod)")
    ap.add_argument("--shapes", default="c=1,1000/s,c=32", help="load shapes: c=N closed loop, R/s open loop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=800, help="requests per phase at c=1")
    ap.add_argument("--load-requests", type=int, default=9600, help="requests per phase at c=N, N > 1")
    ap.add_argument("--rate-requests", type=int, default=2400, help="requests per open-loop phase")
    ap.add_argument("--speedup", type=float, default=10000.0)
    ap.add_argument("--repeats", type=int, default=300, help="filler sentences per prompt (300 = the study's ~28 KB)")
    ap.add_argument("--ext-workers", type=int, default=1, help="kvroute-ext-proc tokio worker threads")
    ap.add_argument("--stream-tokens", type=int, default=0,
                    help="stream N tokens per response (SSE) (0: max_tokens 1, no stream)")
    ap.add_argument("--smoke", action="store_true", help="1 round, 20 requests per phase (32 at c=32), c=1 and c=32")
    args = ap.parse_args()
    warmup = 200
    if args.smoke:
        args.rounds, args.requests, args.load_requests, warmup = 1, 20, 32, 20
        args.shapes = "c=1,c=32"
    names = (args.targets or ("rr,buf,kv,mod" if args.smoke else "rr,buf,floor,kv,mod,sg,direct"
                                  + (",kv-untimed" if args.stream_tokens else ""))).split(",")
    for n in names:
        if n not in TARGETS:
            sys.exit(f"unknown target {n!r}; known: {', '.join(TARGETS)}")
    shapes = parse_shapes(args.shapes, args)
    for b in (os.path.join(BIN, "kvroute-ext-proc"), os.path.join(BIN, "kvroute-sim"), ENVOY) + \
            ((os.path.join(BIN, "examples", "floor"),) if "floor" in names else ()) + \
            ((os.path.join(BIN, MODULE),) if "mod" in names else ()):
        if not os.access(b, os.R_OK if b.endswith(".so") else os.X_OK):
            sys.exit(f"missing {b} (run: make bench-envoy)")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: stop the children
    work, ok = tempfile.mkdtemp(prefix="kvroute-bench."), False
    try:
        bench = Bench(args, work)
        specs = [(n, TARGETS[n].setup(bench)) for n in names]
        bench.start_envoy()
        targets = [(n, bench.addr(s)) for n, s in specs]
        bodies = study_bodies(4096, args.repeats, stream_tokens=args.stream_tokens)
        kind = f"streaming {args.stream_tokens} tokens" if args.stream_tokens else "max_tokens 1"
        print(f"body size {len(bodies[0])} bytes, {kind}; replicas at speed-up {args.speedup:g}; {args.rounds} rounds x "
              + ", ".join(f"{s}: {c}" for s, _, c, _ in shapes) + " requests per target; targets " + ",".join(names))
        answered = Counter()  # responses per kvroute instance, which must have routed each once
        for n, addr in targets:  # warm-up: connections, index, allocator, sglang's tree
            ph, _ = asyncio.run(run_phase(addr, bodies, warmup, 4, 0, routed=TARGETS[n].routed))
            if ph.errors:
                sys.exit(f"{n}: warm-up failed: {Counter(map(str, ph.errors)).most_common(3)}")
            if TARGETS[n].kvroute:
                answered[TARGETS[n].kvroute] += len(ph.lat)
        results = measure(bench, targets, shapes, bodies, args.rounds, answered)
        report(results, names, shapes)
        failed = []
        for name in sorted(answered):
            metrics = lambda: urllib.request.urlopen(f"http://{bench.kvroute_admin[name]}/metrics").read().decode()
            value = lambda text, prefix: sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))
            deadline = time.time() + 2  # ext_proc: Envoy closes a side stream ~1 ms after its response
            while value(text := metrics(), "kvroute_pod_in_flight{") and time.time() < deadline:
                time.sleep(0.05)
            in_flight, routed = value(text, "kvroute_pod_in_flight{"), value(text, "kvroute_routed_total{")
            what = "the module in Envoy" if name == "module" else f"kvroute-ext-proc {name}"
            print(f"kvroute {name} ({what}): in-flight after the run {in_flight:g} (must be 0), requests routed "
                  f"{routed:g} (must be the {answered[name]} answered), responses timed "
                  f"{value(text, 'kvroute_timed_responses_total'):g}")
            if in_flight or routed != answered[name]:
                failed.append(f"kvroute {name}: in-flight {in_flight:g}, routed {routed:g} of {answered[name]}")
        if "module" in bench.procs:
            print(f"the module's thread in Envoy: {bench.cpu('module') / 1e6:.0f} ms CPU since Envoy started "
                  f"(left out of the other Envoy targets' CPU)")
        errors = Counter(str(e) for rows in results.values() for x in rows for e in x["errors"])
        if errors:
            failed.append(f"{sum(errors.values())} requests failed: {dict(errors.most_common(5))}")
            if UNROUTED in errors or MISROUTED in errors:
                failed.append(f"{errors[UNROUTED] + errors[MISROUTED]} responses not routed by kvroute "
                              "(without a target-pod header, or from another replica than it names)")
        if failed:
            print("FAILED: " + "; ".join(failed))
            return 1
        ok = True
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        ok = True  # nothing to look into
        return 130
    finally:
        stop_all()
        if ok:
            subprocess.run(["rm", "-rf", work])
        else:
            print(f"logs kept in {work}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
