"""Drives a real engine KV-event publisher (SGLang's or vLLM's ZmqEventPublisher,
unmodified) from JSON commands, for the router's integration tests.

Usage: python kv_publisher.py {sglang|vllm} CACHE_DIR

Binds the PUB and replay sockets on 127.0.0.1 ports the OS picks and prints
`{"pub": endpoint, "replay": endpoint}`. Then reads one JSON command per line from
stdin and answers each with one JSON line once the publisher thread has sent
everything queued so far:

- `{"op": "store", "hashes": [...], "parent": h|null, "tokens": [...], "block_size": n,
  "lora": name?, "salt": s?}` (`lora`: vLLM's `lora_name`; SGLang's events name no
  adapter. `salt`: SGLang's `cache_salt`; vLLM's first page's extra keys, as vLLM
  gives a salted request's page at token 0)
- `{"op": "remove", "hashes": [...]}` and `{"op": "clear"}`
- `{"op": "lose_next"}`: the next batch misses the live socket but stays replayable,
  as a batch lost in transit
- `{"op": "skip_seq"}`: a sequence number is used up without a batch, so the gap can
  never be replayed
- `{"op": "restart"}`: the publisher shuts down and a new one binds the same
  endpoints, sequence back at 0 and history empty, as when the engine restarts

End of input shuts the publisher down.
"""
import json
import sys
import time
from pathlib import Path

import zmq

import engine_modules

kind, cache = sys.argv[1], Path(sys.argv[2])


def hash_value(h):
    """JSON cannot carry bytes: `{"bin": hex}` stands for a binary hash."""
    return bytes.fromhex(h["bin"]) if isinstance(h, dict) else h


if kind == "sglang":
    kv = engine_modules.load_sglang(cache / "sglang").kv_events

    def new_publisher(pub, replay):
        return kv.ZmqEventPublisher(attn_dp_rank=0, endpoint=pub, replay_endpoint=replay, topic="kv", bind=True)

    def stored(c):
        return kv.BlockStored(
            block_hashes=c["hashes"], parent_block_hash=c["parent"], token_ids=c["tokens"],
            block_size=c["block_size"], lora_id=None, medium="GPU", cache_salt=c.get("salt"),
        )

    def removed(c):
        return kv.BlockRemoved(block_hashes=c["hashes"], medium="GPU")

elif kind == "vllm":
    kv = engine_modules.load_vllm(cache / "vllm").kv_events

    class LoopbackPublisher(kv.ZmqEventPublisher):
        """vLLM binds only wildcard endpoints (`tcp://*:5557`) and connects to the
        rest; the tests bind loopback, as SGLang's `bind=True` does."""

        _is_bind_endpoint = staticmethod(lambda endpoint: True)

    def new_publisher(pub, replay):
        return LoopbackPublisher(data_parallel_rank=0, endpoint=pub, replay_endpoint=replay, topic="kv")

    def stored(c):
        parent = c["parent"]
        return kv.BlockStored(
            block_hashes=[hash_value(h) for h in c["hashes"]],
            parent_block_hash=None if parent is None else hash_value(parent),
            token_ids=c["tokens"], block_size=c["block_size"], lora_id=None, medium="GPU",
            lora_name=c.get("lora"),
            extra_keys=None if c.get("salt") is None else [
                [c["salt"]] if i == 0 else None for i in range(len(c["hashes"]))
            ],
        )

    def removed(c):
        return kv.BlockRemoved(block_hashes=[hash_value(h) for h in c["hashes"]], medium="GPU")

else:
    sys.exit(f"unknown engine kind {kind!r}: expected sglang or vllm")


class LoseNext:
    """Stands in for the PUB socket for one send, which it drops."""

    def __init__(self, publisher):
        self.publisher, self.socket = publisher, publisher._pub

    def send_multipart(self, frames):
        self.publisher._pub = self.socket


def rebind(endpoints):
    """A new publisher on the old endpoints, once the closed sockets have released
    them (ZeroMQ closes asynchronously)."""
    for _ in range(200):
        try:
            return new_publisher(endpoints["pub"], endpoints["replay"])
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE:
                raise
            time.sleep(0.025)
    sys.exit(f"{endpoints} stayed in use")


def bound(socket):
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


publisher = new_publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
endpoints = {"pub": bound(publisher._pub), "replay": bound(publisher._replay)}
print(json.dumps(endpoints), flush=True)

for line in sys.stdin:
    command = json.loads(line)
    op = command["op"]
    if op == "store":
        publisher.publish(kv.KVEventBatch(ts=1.0, events=[stored(command)]))
    elif op == "remove":
        publisher.publish(kv.KVEventBatch(ts=1.0, events=[removed(command)]))
    elif op == "clear":
        publisher.publish(kv.KVEventBatch(ts=1.0, events=[kv.AllBlocksCleared()]))
    elif op == "lose_next":
        publisher._pub = LoseNext(publisher)
    elif op == "skip_seq":
        next(publisher._seq_gen)
    elif op == "restart":
        publisher._event_queue.join()
        publisher.shutdown()
        publisher = rebind(endpoints)
    else:
        sys.exit(f"unknown op {op!r}")
    publisher._event_queue.join()
    print(json.dumps({"done": op}), flush=True)

publisher.shutdown()
