#!/usr/bin/env python3
"""Generates tests/kv-events/: vLLM KV-cache event batches encoded by msgspec exactly as vLLM
publishes them (every layout vLLM has used), plus expected.json describing the decoded content,
for the Rust crate kv-events (kvroute-kv-events) to be tested against. Also serves those batches
over real libzmq (pyzmq) for the crate's interop test.

Usage (from anywhere):
  python3 scripts/gen-kv-events.py              write tests/kv-events/ (deterministic)
  python3 scripts/gen-kv-events.py venv         only set up the venv; print its python's path
  python3 scripts/gen-kv-events.py pyzmq-serve [--topic T] [--replay-format topic|legacy]
      a stand-in for vLLM's ZmqEventPublisher on real libzmq: binds a PUB and a ROUTER socket on
      127.0.0.1 (ephemeral ports), prints {"pub": ..., "replay": ...} as one JSON line, then
      obeys commands on stdin, one a line, answering one line each:
        pub CASE LAYOUT    encode golden case CASE in LAYOUT, send (topic, seq, payload) -> "ok SEQ"
        drop CASE LAYOUT   as pub, but only into the replay buffer (a lost message) -> "ok SEQ"
        quit               exit (so does EOF on stdin, or --max-seconds elapsing)
      and answers replay requests on the ROUTER socket as vLLM does.
  python3 scripts/gen-kv-events.py pyzmq-client --pub EP --replay EP --topic T --count N --start S
      a libzmq SUB + DEALER client for a kvroute publisher: receives N live messages, then
      requests a replay from seq S; prints one JSON line with everything it got (hex payloads).

The script creates .venv-gen/ at the repository root if missing (the venv gen-tokenizer.py uses;
it is git-ignored) and installs the pinned packages below into it, then re-executes itself with
that venv's Python. Output is deterministic: running it twice gives byte-identical files.

What vLLM publishes (vllm/distributed/kv_events.py):
- EventBatch(ts: float, events: list, data_parallel_rank: int | None = None) is a msgspec Struct
  with array_like=True and omit_defaults=True: the batch is a msgpack array [ts, events] or
  [ts, events, data_parallel_rank] (the trailing default None is omitted).
- KVCacheEvent (base of BlockStored, BlockRemoved, AllBlocksCleared) is tagged (tag=True: the tag
  is the class name, under msgspec's default tag_field "type") with omit_defaults=True, and
  - up to vLLM PR #42892 (June 2026) array_like=True: each event is an array whose element 0 is
    the tag and the rest the fields in declaration order, trailing default-valued fields omitted
    ("positional");
  - since then a map {"type": tag, field: value, ...} in declaration order with default-valued
    fields omitted ("map"). The batch stayed positional.
- One stored vLLM snapshot also shows EventBatch without array_like, i.e. the batch itself as a map
  {"ts", "events", "data_parallel_rank"} around map events ("map_batch"); consumers accept it too.
See tests/kv-events/README.md.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-gen"
OUT = ROOT / "tests" / "kv-events"

# Exact pins (both are self-contained wheels: pyzmq bundles libzmq; neither needs dependencies
# on CPython).
PINS = {"msgspec": "0.23.0", "pyzmq": "27.3.0"}

LAYOUTS = ("positional", "map", "map_batch")


# ---------------------------------------------------------------------------------------------
# Bootstrap: run inside .venv-gen with the pinned packages.

def in_gen_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def bootstrap():
    py = VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {VENV.relative_to(ROOT)}/", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = ("import importlib.metadata as m, json, sys\n"
             "out = {}\n"
             "for n in sys.argv[1:]:\n"
             "    try: out[n] = m.version(n)\n"
             "    except m.PackageNotFoundError: out[n] = None\n"
             "print(json.dumps(out))\n")
    have = json.loads(subprocess.run([str(py), "-c", probe, *PINS], check=True,
                                     capture_output=True, text=True).stdout)
    if have != PINS:
        print(f"installing {', '.join(f'{n}=={v}' for n, v in PINS.items())} into "
              f"{VENV.relative_to(ROOT)}/", file=sys.stderr)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:",
                        *(f"{n}=={v}" for n, v in PINS.items())], check=True)
    env = dict(os.environ, PYTHONHASHSEED="0")
    os.execve(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]], env)


# ---------------------------------------------------------------------------------------------
# vLLM's event structs, declared as vLLM declares them, once per layout.

def make_types(events_array_like: bool, batch_array_like: bool):
    """Returns a namespace of (EventBatch, BlockStored, BlockRemoved, AllBlocksCleared) with the
    field lists and struct options of vllm/distributed/kv_events.py (current main: lora_name,
    extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window)."""
    import msgspec

    ExternalBlockHash = bytes | int

    class EventBatch(msgspec.Struct, array_like=batch_array_like, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=events_array_like, omit_defaults=True,
                       gc=False, tag=True):
        """Base class for all KV cache-related events"""

    class BlockStored(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: ExternalBlockHash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    # Not vLLM's: an event type a future vLLM might add (the consumer must skip it), and extra
    # fields a newer or forked publisher adds (the consumer must ignore them).
    class BlockUpdated(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        priority: int

    class BlockStoredExtended(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: ExternalBlockHash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None
        session_id: str | None = None
        scores: dict[str, float] | None = None

    class BlockRemovedExtended(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[ExternalBlockHash]
        medium: str | None
        group_idx: int | None = None
        ownership: str | None = None

    # Older positional publishers: vLLM 0.10 (no medium, no lora_name) and SGLang's shorter
    # BlockStored/BlockRemoved.
    class BlockStoredV010(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: ExternalBlockHash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None

    class BlockRemovedV010(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[ExternalBlockHash]

    class T:
        pass

    for c in (EventBatch, BlockStored, BlockRemoved, AllBlocksCleared, BlockUpdated,
              BlockStoredExtended, BlockRemovedExtended, BlockStoredV010, BlockRemovedV010):
        setattr(T, c.__name__, c)
    return T


def types_for(layout: str):
    return {
        "positional": lambda: make_types(events_array_like=True, batch_array_like=True),
        "map": lambda: make_types(events_array_like=False, batch_array_like=True),
        "map_batch": lambda: make_types(events_array_like=False, batch_array_like=False),
    }[layout]()


# ---------------------------------------------------------------------------------------------
# Golden cases. Each builder takes the layout's type namespace and returns an EventBatch.

def sha(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def low64(digest: bytes) -> int:
    # vLLM's maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (the default).
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def case_stored_int_hashes(T):
    return T.EventBatch(ts=1789095808.8378847, events=[
        T.BlockStored(
            block_hashes=[low64(sha("b0")), low64(sha("b1")), 0, 127, 128, 255, 256, 65535,
                          65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1],
            parent_block_hash=None,
            token_ids=list(range(16)),
            block_size=16, lora_id=None, medium="GPU", lora_name=None),
    ])


def case_stored_bytes_hashes(T):
    return T.EventBatch(ts=1767225600.0, data_parallel_rank=3, events=[
        T.BlockStored(
            block_hashes=[sha("c0"), sha("c1"), b"\x01\x02\x03", b""],
            parent_block_hash=sha("parent"),
            token_ids=[128000, 9906, 11, 1917, 0, 65535, 65536, 4294967295],
            block_size=4, lora_id=7, medium="CPU", lora_name="sql-adapter",
            extra_keys=[
                ("tenant-a-cache-salt",),
                None,
                (("mm-9f86d081884c7d65", 0), "sql-adapter"),
                (sha("prompt-embeds")[:16], -1, 3.5, True, None, [1, "x"]),
            ],
            group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096),
    ])


def case_removed_and_cleared(T):
    return T.EventBatch(ts=1767225601.25, data_parallel_rank=0, events=[
        T.BlockRemoved(block_hashes=[low64(sha("b0")), 1 << 63], medium="GPU"),
        T.BlockRemoved(block_hashes=[sha("c0")], medium="CPU", group_idx=2),
        T.BlockRemoved(block_hashes=[], medium=None),
        T.AllBlocksCleared(),
    ])


def case_defaults_in_the_middle(T):
    # Positional omit_defaults trims only *trailing* defaults: extra_keys=None before a set
    # group_idx stays as nil; an all-default tail disappears.
    return T.EventBatch(ts=0.5, events=[
        T.BlockStored(block_hashes=[1], parent_block_hash=0, token_ids=[1, 2], block_size=2,
                      lora_id=None, medium="GPU", lora_name=None, group_idx=0),
        T.BlockStored(block_hashes=[2], parent_block_hash=1, token_ids=[3, 4], block_size=2,
                      lora_id=None, medium=None, lora_name=None, extra_keys=[],
                      kv_cache_spec_kind="full_attention"),
        T.BlockStored(block_hashes=[3], parent_block_hash=2, token_ids=[5, 6], block_size=2,
                      lora_id=None, medium="GPU", lora_name=None,
                      kv_cache_spec_sliding_window=128),
        T.BlockRemoved(block_hashes=[3], medium=None, group_idx=0),
    ])


def case_negative_int_hashes(T):
    # Older vLLM hashed with Python's hash(): signed 64-bit values, msgpack negative ints.
    return T.EventBatch(ts=-1.5, data_parallel_rank=65536, events=[
        T.BlockStored(block_hashes=[-1, -32, -33, -128, -129, -32768, -32769, -(1 << 31),
                                    -(1 << 31) - 1, -(1 << 63)],
                      parent_block_hash=-5, token_ids=[42], block_size=1, lora_id=-1,
                      medium="GPU", lora_name=None),
        T.BlockRemoved(block_hashes=[-1, 5], medium="GPU"),
    ])


def case_empty_batch(T):
    return T.EventBatch(ts=1e-300, events=[])


def case_long_strings(T):
    return T.EventBatch(ts=1.7976931348623157e308, data_parallel_rank=255, events=[
        T.BlockStored(block_hashes=[low64(sha(f"long{i}")) for i in range(20)],
                      parent_block_hash=low64(sha("long-parent")),
                      token_ids=[i * 7919 % 200000 for i in range(20 * 16)],
                      block_size=16, lora_id=1 << 40, medium="GPU",
                      lora_name="adapter-" + "x" * 24 + "-é-✓",
                      extra_keys=[("s" * 300,)] + [None] * 19,
                      kv_cache_spec_kind="k" * 70000),
    ])


def case_unknown_event_tag(T):
    return T.EventBatch(ts=2.0, events=[
        T.BlockStored(block_hashes=[10], parent_block_hash=None, token_ids=[1], block_size=1,
                      lora_id=None, medium="GPU", lora_name=None),
        T.BlockUpdated(block_hashes=[10], priority=3),
        T.AllBlocksCleared(),
    ])


def case_unknown_fields(T):
    return T.EventBatch(ts=3.0, events=[
        T.BlockStoredExtended(block_hashes=[11], parent_block_hash=10, token_ids=[1, 2],
                              block_size=2, lora_id=None, medium="GPU", lora_name=None,
                              group_idx=0, locality="LOCAL", session_id="sess-1",
                              scores={"a": 1.0}),
        T.BlockRemovedExtended(block_hashes=[11], medium="GPU", ownership="tier-2"),
    ])


def case_old_positional(T):
    return T.EventBatch(ts=4.0, events=[
        T.BlockStoredV010(block_hashes=[12, 13], parent_block_hash=None, token_ids=[1, 2, 3, 4],
                          block_size=2, lora_id=None),
        T.BlockRemovedV010(block_hashes=[12]),
    ])


# (name, builder, layouts, roundtrip, description). roundtrip: encode(decode(file)) must give
# the file back byte for byte (true for everything vLLM's own structs produce).
CASES = [
    ("stored_int_hashes", case_stored_int_hashes, LAYOUTS, True,
     "BlockStored with int hashes of every msgpack uint width, None parent, no dp rank"),
    ("stored_bytes_hashes", case_stored_bytes_hashes, LAYOUTS, True,
     "BlockStored with bytes hashes and parent, medium CPU, lora_id/lora_name, extra_keys with a "
     "cache_salt-like string, None, an mm (identifier, offset) tuple, mixed values; group_idx, "
     "kv_cache_spec_*; dp rank 3"),
    ("removed_and_cleared", case_removed_and_cleared, LAYOUTS, True,
     "BlockRemoved (int, bytes, empty, GPU/CPU/None medium, group_idx) and AllBlocksCleared; dp rank 0"),
    ("defaults_in_the_middle", case_defaults_in_the_middle, LAYOUTS, True,
     "omit_defaults: a default (None) before a set field is kept in positional layout"),
    ("negative_int_hashes", case_negative_int_hashes, LAYOUTS, True,
     "negative int hashes of every msgpack int width (older vLLM's hash()), negative lora_id and ts"),
    ("empty_batch", case_empty_batch, LAYOUTS, True, "no events"),
    ("long_strings", case_long_strings, LAYOUTS, True,
     "str8/str16/str32 lengths, array16 token ids, non-ASCII lora_name, u64-wide lora_id"),
    ("unknown_event_tag", case_unknown_event_tag, LAYOUTS, False,
     "an event tag the consumer does not know (BlockUpdated) between known ones: skipped, reported"),
    ("unknown_fields", case_unknown_fields, ("positional", "map", "map_batch"), False,
     "extra trailing positional fields and unknown map keys (locality, session_id, scores, "
     "ownership): ignored"),
    ("old_positional", case_old_positional, ("positional",), False,
     "vLLM 0.10 / SGLang-style short positional BlockStored (no medium, lora_name) and BlockRemoved"),
]


# ---------------------------------------------------------------------------------------------
# Expected decoded content, as JSON.

def j_hash(h):
    if isinstance(h, bytes):
        return {"bytes": h.hex(), "fold": low64(h)}
    return {"int": h, "fold": h & ((1 << 64) - 1)}


def j_value(v):
    if v is None:
        return None
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v, "bits": struct.pack(">d", v).hex()}
    if isinstance(v, str):
        return {"str": v}
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (tuple, list)):
        return {"array": [j_value(x) for x in v]}
    raise TypeError(type(v))


def expected_event(ev):
    name = type(ev).__struct_config__.tag
    if name == "BlockStored":
        return {
            "type": "BlockStored",
            "block_hashes": [j_hash(h) for h in ev.block_hashes],
            "parent_block_hash": None if ev.parent_block_hash is None else j_hash(ev.parent_block_hash),
            "token_ids": list(ev.token_ids),
            "block_size": ev.block_size,
            "lora_id": ev.lora_id,
            "medium": getattr(ev, "medium", None),
            "lora_name": getattr(ev, "lora_name", None),
            "extra_keys": None if getattr(ev, "extra_keys", None) is None else
            [None if k is None else [j_value(x) for x in k] for k in ev.extra_keys],
            "group_idx": getattr(ev, "group_idx", None),
            "kv_cache_spec_kind": getattr(ev, "kv_cache_spec_kind", None),
            "kv_cache_spec_sliding_window": getattr(ev, "kv_cache_spec_sliding_window", None),
        }
    if name == "BlockRemoved":
        return {
            "type": "BlockRemoved",
            "block_hashes": [j_hash(h) for h in ev.block_hashes],
            "medium": getattr(ev, "medium", None),
            "group_idx": getattr(ev, "group_idx", None),
        }
    if name == "AllBlocksCleared":
        return {"type": "AllBlocksCleared"}
    return None  # unknown to the consumer


def expected_batch(batch):
    events, skipped = [], []
    for i, ev in enumerate(batch.events):
        e = expected_event(ev)
        if e is None:
            skipped.append({"index": i, "type": type(ev).__struct_config__.tag})
        else:
            events.append(e)
    return {
        "ts": batch.ts,
        "ts_bits": struct.pack(">d", batch.ts).hex(),
        "data_parallel_rank": batch.data_parallel_rank,
        "events": events,
        "skipped": skipped,
    }


def encode_case(name: str, layout: str) -> bytes:
    import msgspec
    for n, build, layouts, _, _ in CASES:
        if n == name:
            if layout not in layouts:
                raise KeyError(f"case {name} has no layout {layout}")
            return msgspec.msgpack.Encoder().encode(build(types_for(layout)))
    raise KeyError(name)


def generate():
    import msgspec
    import zmq

    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.msgpack"):
        old.unlink()
    enc = msgspec.msgpack.Encoder()
    cases = []
    for name, build, layouts, roundtrip, desc in CASES:
        files, expected = {}, None
        for layout in layouts:
            T = types_for(layout)
            batch = build(T)
            data = enc.encode(batch)
            fname = f"{name}.{layout}.msgpack"
            (OUT / fname).write_bytes(data)
            files[layout] = {"file": fname, "sha256": hashlib.sha256(data).hexdigest(),
                             "len": len(data)}
            e = expected_batch(batch)
            if expected is None:
                expected = e
            elif expected != e:
                raise AssertionError(f"{name}: layouts disagree")
            # Self-check: the layout's own typed decoder reads the file back.
            back = msgspec.msgpack.Decoder(type(batch)).decode(data)
            assert back.ts == batch.ts and len(back.events) == len(batch.events), name
        cases.append({"name": name, "description": desc, "roundtrip": roundtrip,
                      "files": files, "expected": expected})
    doc = {
        "generator": "scripts/gen-kv-events.py",
        "versions": {"msgspec": msgspec.__version__, "pyzmq": zmq.__version__,
                     "libzmq": zmq.zmq_version()},
        "layouts": {
            "positional": "EventBatch array_like, events array_like [tag, fields...] (vLLM before PR #42892; SGLang)",
            "map": "EventBatch array_like, events maps {\"type\": tag, ...} (vLLM since PR #42892)",
            "map_batch": "EventBatch a map too {\"ts\", \"events\", \"data_parallel_rank\"} around map events",
        },
        "fold": "BlockHash -> u64: int as its 64-bit two's complement; bytes as int.from_bytes(b, 'big') & (2**64-1) "
                "(vLLM's maybe_convert_block_hash)",
        "cases": cases,
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=False) + "\n"
    (OUT / "expected.json").write_text(text)
    total = sum(len(c["files"]) for c in cases)
    print(f"msgspec {msgspec.__version__}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}): "
          f"{len(cases)} cases, {total} msgpack files, expected.json sha256 "
          f"{hashlib.sha256(text.encode()).hexdigest()[:16]}")


# ---------------------------------------------------------------------------------------------
# pyzmq stand-in for vLLM's ZmqEventPublisher, and a pyzmq client for kvroute's publisher.

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def serve(args):
    import queue
    import threading
    import time

    import zmq

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.set_hwm(100_000)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    topic = args.topic.encode()
    print(json.dumps({"pub": pub.getsockopt_string(zmq.LAST_ENDPOINT),
                      "replay": router.getsockopt_string(zmq.LAST_ENDPOINT)}), flush=True)

    commands: "queue.Queue[str | None]" = queue.Queue()

    def read_stdin():
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put(None)

    threading.Thread(target=read_stdin, daemon=True).start()
    buffer: list[tuple[int, bytes]] = []
    next_seq = 0
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        # Replay, as vLLM's ZmqEventPublisher._service_replay: request frames
        # (client_id, b"", start_seq 8-byte big-endian); one reply per buffered seq >= start,
        # then an end marker with seq -1 and an empty payload.
        while router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            client_id, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in buffer:
                if seq >= start_seq:
                    if args.replay_format == "topic":  # vLLM >= PR #45177
                        router.send_multipart((client_id, b"", topic, seq.to_bytes(8, "big"), payload))
                    else:
                        router.send_multipart((client_id, b"", seq.to_bytes(8, "big"), payload))
            if args.replay_format == "topic":
                router.send_multipart((client_id, b"", b"", END_SEQ, b""))
            else:
                router.send_multipart((client_id, b"", END_SEQ, b""))
        try:
            cmd = commands.get(timeout=0.01)
        except queue.Empty:
            continue
        if cmd is None or cmd == "quit":
            break
        parts = cmd.split()
        if len(parts) == 3 and parts[0] in ("pub", "drop"):
            try:
                payload = encode_case(parts[1], parts[2])
            except KeyError as e:
                print(f"error {e}", flush=True)
                continue
            seq = next_seq
            next_seq += 1
            if parts[0] == "pub":
                pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
            buffer.append((seq, payload))
            print(f"ok {seq}", flush=True)
        else:
            print(f"error unknown command {cmd!r}", flush=True)
    pub.close(linger=0)
    router.close(linger=0)


def client(args):
    import time

    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.pub)
    print(json.dumps({"subscribed": True}), flush=True)
    live = []
    deadline = time.monotonic() + args.max_seconds
    while len(live) < args.count and time.monotonic() < deadline:
        if sub.poll(50):
            frames = sub.recv_multipart()
            live.append([f.hex() for f in frames])
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(args.replay)
    dealer.send_multipart((b"", args.start.to_bytes(8, "big")))
    replay, ended = [], False
    while time.monotonic() < deadline:
        if not dealer.poll(100):
            continue
        frames = dealer.recv_multipart()
        replay.append([f.hex() for f in frames])
        if len(frames) >= 2 and frames[-2] == END_SEQ and frames[-1] == b"":
            ended = True
            break
    print(json.dumps({"live": live, "replay": replay, "ended": ended}), flush=True)
    sub.close(linger=0)
    dealer.close(linger=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("venv")
    s = sub.add_parser("pyzmq-serve")
    s.add_argument("--topic", default="")
    s.add_argument("--replay-format", choices=("topic", "legacy"), default="topic")
    s.add_argument("--max-seconds", type=float, default=60.0)
    c = sub.add_parser("pyzmq-client")
    c.add_argument("--pub", required=True)
    c.add_argument("--replay", required=True)
    c.add_argument("--topic", default="")
    c.add_argument("--count", type=int, default=1)
    c.add_argument("--start", type=int, default=0)
    c.add_argument("--max-seconds", type=float, default=30.0)
    args = ap.parse_args()
    if args.cmd == "venv":
        print(sys.executable)
    elif args.cmd == "pyzmq-serve":
        serve(args)
    elif args.cmd == "pyzmq-client":
        client(args)
    else:
        generate()


if __name__ == "__main__":
    if not in_gen_venv():
        try:
            bootstrap()
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"error: could not set up {VENV.relative_to(ROOT)}/ with "
                     f"{', '.join(f'{n}=={v}' for n, v in PINS.items())} (no access to PyPI?): {e}")
    main()
