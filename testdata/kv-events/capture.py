"""Captures KV-event batches published by the real SGLang and vLLM publishers.

Usage: python capture.py SGLANG_ROOT VLLM_ROOT > frames.txt
(each ROOT holds an unzipped wheel: pip download --no-deps sglang==0.5.23 /
vllm==0.33.0). Needs msgspec, pyzmq, pydantic, psutil, urllib3.

The publisher modules run unmodified; only the packages' heavy __init__ files are
bypassed with stub packages. Each scenario publishes batches through the engine's own
ZmqEventPublisher and reads them back through its replay socket (no slow-joiner race).
The legacy positional form is produced with array-like twins of the same classes, as
older releases declared them. Output lines: `name seq topic-hex payload-hex`.
"""
import socket
import sys
import time
from pathlib import Path
from typing import Optional

import msgspec
import zmq

sglang_root, vllm_root = sys.argv[1], sys.argv[2]


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
import engine_modules  # noqa: E402

sgl = engine_modules.load_sglang(sglang_root).kv_events
vll = engine_modules.load_vllm(vllm_root).kv_events


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay_all(port, count):
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(200):
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        frames = []
        while True:
            reply = dealer.recv_multipart()
            if reply[-2] == b"\xff" * 8:
                break
            frames.append(reply)
        if len(frames) >= count:
            dealer.close()
            return frames
        time.sleep(0.05)
    raise RuntimeError("the publisher never buffered the batches")


def capture(prefix, publisher_class, batches, **kwargs):
    pub_port, replay_port = free_port(), free_port()
    publisher = publisher_class(
        endpoint=f"tcp://127.0.0.1:{pub_port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic="kv", **kwargs
    )
    for batch in batches:
        publisher.publish(batch)
    for name, (_, topic, seq, payload) in zip([n for n, _ in batches_named[prefix]], replay_all(replay_port, len(batches))):
        print(f"{prefix}.{name} {int.from_bytes(seq, 'big')} {topic.hex()} {payload.hex()}")
    publisher.shutdown()


def twin(cls):
    fields = []
    for f in msgspec.structs.fields(cls):
        fields.append((f.name, f.type) if f.default is msgspec.NODEFAULT else (f.name, f.type, f.default))
    return msgspec.defstruct(cls.__name__, fields, array_like=True, tag=True, omit_defaults=True)


tokens = list(range(1, 33))
sgl_stored_root = sgl.BlockStored(block_hashes=[-5, 7], parent_block_hash=None, token_ids=tokens, block_size=16, lora_id=None, medium="GPU")
sgl_stored_child = sgl.BlockStored(
    block_hashes=[-9223372036854775808], parent_block_hash=7, token_ids=list(range(33, 49)), block_size=16,
    lora_id=None, medium="CPU_PINNED", cache_salt="tenant-a", lora_name="adapter-1",
)
sgl_bigram = sgl.BlockStored(
    block_hashes=[11], parent_block_hash=None, token_ids=[[i, i + 1] for i in range(100, 116)], block_size=16,
    lora_id=None, medium="GPU",
)
batches_named = {
    "sglang.map": [
        ("stored", sgl.KVEventBatch(ts=1.5, events=[sgl_stored_root])),
        ("stored_child_cpu_salted", sgl.KVEventBatch(ts=2.0, events=[sgl_stored_child])),
        ("stored_bigram", sgl.KVEventBatch(ts=2.5, events=[sgl_bigram])),
        ("removed", sgl.KVEventBatch(ts=3.0, events=[sgl.BlockRemoved(block_hashes=[7], medium="GPU")])),
        ("cleared", sgl.KVEventBatch(ts=4.0, events=[sgl.AllBlocksCleared()])),
        ("mixed", sgl.KVEventBatch(ts=5.0, events=[sgl_stored_root, sgl.BlockRemoved(block_hashes=[-5]), sgl.AllBlocksCleared()])),
    ],
}
capture("sglang.map", lambda **kw: sgl.ZmqEventPublisher(attn_dp_rank=0, bind=True, **kw), [b for _, b in batches_named["sglang.map"]])

# Older SGLang: positional events with the tag first, fields up to `medium`.
LegacyStored = msgspec.defstruct(
    "BlockStored",
    [("block_hashes", list[int]), ("parent_block_hash", Optional[int]), ("token_ids", list), ("block_size", int),
     ("lora_id", Optional[int]), ("medium", Optional[str], None)],
    array_like=True, tag=True,
)
LegacyRemoved = msgspec.defstruct("BlockRemoved", [("block_hashes", list[int]), ("medium", Optional[str], None)], array_like=True, tag=True)
LegacyCleared = msgspec.defstruct("AllBlocksCleared", [], array_like=True, tag=True)
LegacyBatch = msgspec.defstruct("EventBatch", [("ts", float), ("events", list), ("attn_dp_rank", Optional[int], None)], array_like=True)
batches_named["sglang.array"] = [
    ("stored", LegacyBatch(1.5, [LegacyStored([-5, 7], None, tokens, 16, None, "GPU")], 0)),
    ("stored_no_medium", LegacyBatch(2.0, [LegacyStored([-9], 7, list(range(33, 49)), 16, None)], 0)),
    ("removed", LegacyBatch(3.0, [LegacyRemoved([7], "GPU")], 0)),
    ("cleared", LegacyBatch(4.0, [LegacyCleared()], 0)),
]
capture("sglang.array", lambda **kw: sgl.ZmqEventPublisher(attn_dp_rank=0, bind=True, **kw), [b for _, b in batches_named["sglang.array"]])

U64 = 2**64 - 5
digest = bytes(range(32))
vll_stored = vll.BlockStored(
    block_hashes=[U64, 2**63], parent_block_hash=None, token_ids=tokens, block_size=16, lora_id=None, medium="GPU", lora_name=None,
)
vll_bin = vll.BlockStored(
    block_hashes=[digest], parent_block_hash=2**63, token_ids=list(range(33, 49)), block_size=16, lora_id=None, medium="CPU",
    lora_name="adapter-1", extra_keys=[("adapter-1",)], group_idx=0, kv_cache_spec_kind="full_attention",
)
vll_group = vll.BlockStored(
    block_hashes=[42], parent_block_hash=None, token_ids=list(range(16)), block_size=16, lora_id=None, medium="GPU",
    lora_name=None, group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
)
batches_named["vllm.map"] = [
    ("stored_u64", vll.KVEventBatch(ts=1.5, events=[vll_stored])),
    ("stored_bin_cpu", vll.KVEventBatch(ts=2.0, events=[vll_bin])),
    ("stored_sliding_window_group", vll.KVEventBatch(ts=2.5, events=[vll_group])),
    ("removed_u64", vll.KVEventBatch(ts=3.0, events=[vll.BlockRemoved(block_hashes=[U64], medium="GPU")])),
    ("cleared", vll.KVEventBatch(ts=4.0, events=[vll.AllBlocksCleared()])),
]
capture("vllm.map", lambda **kw: vll.ZmqEventPublisher(data_parallel_rank=0, **kw), [b for _, b in batches_named["vllm.map"]])

# vLLM 0.9-0.25: positional events; a batch without a rank has two elements.
VStored, VRemoved, VCleared = twin(vll.BlockStored), twin(vll.BlockRemoved), twin(vll.AllBlocksCleared)
batches_named["vllm.array"] = [
    ("stored_u64", vll.EventBatch(ts=1.5, events=[VStored(block_hashes=[U64, 2**63], parent_block_hash=None, token_ids=tokens, block_size=16, lora_id=None, medium="GPU", lora_name=None)], data_parallel_rank=0)),
    ("removed_u64", vll.EventBatch(ts=3.0, events=[VRemoved(block_hashes=[U64], medium="GPU")], data_parallel_rank=0)),
    ("cleared", vll.EventBatch(ts=4.0, events=[VCleared()], data_parallel_rank=0)),
]
capture("vllm.array", lambda **kw: vll.ZmqEventPublisher(data_parallel_rank=0, **kw), [b for _, b in batches_named["vllm.array"]])

# vLLM before data-parallel ranks declared the batch as [ts, events]: two elements.
TwoFieldBatch = msgspec.defstruct("EventBatch", [("ts", float), ("events", list)], array_like=True)
two = msgspec.msgpack.encode(TwoFieldBatch(1.0, [vll.AllBlocksCleared()]))
print(f"vllm.map.two_element_batch 0 6b76 {two.hex()}")
