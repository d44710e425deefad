#!/usr/bin/env python3
"""Generates prefix_hash_v1.json: golden block hashes for kvroute's hash scheme V1, computed
with PyPI's `xxhash` package (python-xxhash, C xxHash underneath), independently of the Rust code.

Scheme V1 (AIBrix v0.7.0 prefix-cache, `getPrefixHashes` in pkg/utils/prefixcacheindexer/hash.go):
  blocks   = complete blocks of `block_size` bytes of the prompt's UTF-8 bytes (partial tail ignored)
  parent_0 = seed
  h_i      = XXH64(seed=seed, data = LE64(parent_i) || block_i);  parent_{i+1} = h_i

Usage: python3 -m venv /tmp/v && /tmp/v/bin/pip install xxhash && /tmp/v/bin/python gen_prefix_hash.py > prefix_hash_v1.json
"""
import json
import random
import struct
import sys

import xxhash


def hashes(prompt: bytes, block_size: int, seed: int):
    out = []
    parent = seed
    for i in range(len(prompt) // block_size):
        block = prompt[i * block_size:(i + 1) * block_size]
        parent = xxhash.xxh64_intdigest(struct.pack("<Q", parent) + block, seed=seed)
        out.append(parent)
    return out


def study_prompt(salt: str, doc: int, question: int) -> bytes:
    sentence = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n"
    return (f"{salt}\nDocument {doc}\n" + sentence * 300
            + f"Question {question:06d}: Explain the operational tradeoffs in detail.").encode()


def main():
    rng = random.Random(20261202)
    cases = []

    def add(prompt: bytes, block_size: int, seed: int, note: str):
        cases.append({
            "note": note,
            "block_size": block_size,
            "seed": seed,
            "prompt_hex": prompt.hex(),
            "hashes": [f"0x{h:016x}" for h in hashes(prompt, block_size, seed)],
        })

    add(b"", 128, 0, "empty prompt: no blocks")
    add(b"x" * 127, 128, 0, "shorter than one block: no blocks")
    add(b"a" * 128, 128, 0, "exactly one block, seed 0")
    add(b"abcdefgh", 4, 42, "two 4-byte blocks")
    add(b"abcdefghij", 4, 42, "partial trailing block ignored")
    add("héllo wörld, ünïcödé straddles blocks".encode(), 5, 7, "multi-byte UTF-8 across block boundaries")
    add(bytes(range(256)) * 3, 64, 2**64 - 1, "all byte values, max seed")
    add(bytes(rng.getrandbits(8) for _ in range(1000)), 128, 12345, "1000 random bytes: 7 blocks (spec 3.8 shape)")
    add(bytes(rng.getrandbits(8) for _ in range(300)), 1, 99, "block size 1")
    salt = "".join(rng.choice("0123456789abcdef") for _ in range(256))
    add(study_prompt(salt, 3, 123456), 128, 0x5EED, "the study's prompt shape (~28 KB)")
    json.dump({"scheme": "v1", "generator": "python-xxhash " + xxhash.VERSION, "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
