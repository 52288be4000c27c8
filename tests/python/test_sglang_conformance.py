"""The frames a simulated engine publishes decode with SGLang's own msgspec schemas.

The schema classes come from the real SGLang wheel (see conftest.sglang). The legacy
positional event form is decoded with array-like twins of those same classes, built
from their declared fields, as older SGLang releases declared them.
"""
import json
import urllib.request
from typing import Optional, Union

import msgspec
import pytest
import zmq

END_SEQ = b"\xff" * 8


def post(url, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null") if response.headers.get("content-type", "").startswith("application/json") else None


def chat(engine, input_ids):
    return post(f"{engine.url}/v1/chat/completions", {"model": "m", "messages": [], "input_ids": input_ids, "max_tokens": 1})


def replay(port, start=0):
    """All buffered batches from `start` on, as (topic, seq, payload)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 20_000)
    socket.connect(f"tcp://127.0.0.1:{port}")
    socket.send_multipart([b"", start.to_bytes(8, "big")])
    batches = []
    try:
        while True:
            empty, topic, seq, payload = socket.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                return batches
            batches.append((topic, int.from_bytes(seq, "big"), payload))
    finally:
        socket.close()


def exercise(engine):
    """Stores two pages, extends the chain, then flushes the cache."""
    chat(engine, list(range(32)))
    chat(engine, list(range(48)))
    post(f"{engine.url}/flush_cache")
    return replay(engine.ports["replay"][0])


def legacy_twin(cls):
    """An array-like, tagged struct with `cls`'s fields in declaration order."""
    fields = []
    for f in msgspec.structs.fields(cls):
        if f.default is msgspec.NODEFAULT:
            fields.append((f.name, f.type))
        else:
            fields.append((f.name, f.type, f.default))
    return msgspec.defstruct(cls.__name__, fields, array_like=True, tag=True)


def check_events(events, stored_type, removed_type, cleared_type):
    stored = [e for e in events if isinstance(e, stored_type)]
    assert [len(e.block_hashes) for e in stored] == [2, 1]
    assert stored[0].parent_block_hash is None
    assert stored[1].parent_block_hash == stored[0].block_hashes[-1]
    assert stored[0].token_ids == list(range(32))
    assert stored[1].token_ids == list(range(32, 48))
    assert all(e.block_size == 16 and e.lora_id is None and e.medium == "GPU" for e in stored)
    assert all(isinstance(h, int) and -(2**63) <= h < 2**63 for e in stored for h in e.block_hashes)
    assert isinstance(events[-1], cleared_type)
    assert not any(isinstance(e, removed_type) for e in events)


def test_map_events_decode_with_sglangs_own_classes(sim, sglang):
    engine = sim("--kv-port", 0, "--replay-port", 0)
    batches = exercise(engine)
    assert [seq for _, seq, _ in batches] == [0, 1, 2]
    decoder = msgspec.msgpack.Decoder(sglang.kv_events.KVEventBatch)
    events = []
    for topic, _, payload in batches:
        assert topic == b""
        batch = decoder.decode(payload)
        assert batch.attn_dp_rank == 0
        assert isinstance(batch.ts, float)
        events.extend(batch.events)
    kv = sglang.kv_events
    check_events(events, kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared)


def test_legacy_array_events_decode_with_array_twins_of_sglangs_classes(sim, sglang):
    engine = sim("--kv-port", 0, "--replay-port", 0, "--kv-event-form", "array")
    batches = exercise(engine)
    kv = sglang.kv_events
    stored, removed, cleared = (legacy_twin(c) for c in (kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared))
    batch_type = msgspec.defstruct(
        "EventBatch",
        [("ts", float), ("events", list[Union[stored, removed, cleared]]), ("attn_dp_rank", Optional[int], None)],
        array_like=True,
    )
    decoder = msgspec.msgpack.Decoder(batch_type)
    events = [e for _, _, payload in batches for e in decoder.decode(payload).events]
    check_events(events, stored, removed, cleared)
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(kv.KVEventBatch).decode(batches[0][2])


def test_evictions_decode_as_block_removed(sim, sglang):
    engine = sim("--kv-port", 0, "--replay-port", 0, "--kv-capacity-tokens", 32)
    chat(engine, list(range(32)))
    chat(engine, list(range(1000, 1032)))
    batches = replay(engine.ports["replay"][0])
    decoder = msgspec.msgpack.Decoder(sglang.kv_events.KVEventBatch)
    second = decoder.decode(batches[1][2]).events
    assert isinstance(second[0], sglang.kv_events.BlockRemoved)
    assert len(second[0].block_hashes) == 2
    assert second[0].medium == "GPU"


@pytest.mark.parametrize("form, native", [("native", True), ("basic", False)])
def test_load_stat_decodes_with_sglangs_own_class(sim, sglang, form, native):
    engine = sim("--kv-port", 0, "--load-port", 0, "--load-form", form)
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 20_000)
    socket.setsockopt(zmq.SUBSCRIBE, b"load")
    socket.connect(f"tcp://127.0.0.1:{engine.ports['load'][0]}")
    try:
        topic, seq, payload = socket.recv_multipart()
    finally:
        socket.close()
    assert topic == b"load" and len(seq) == 8
    stat = msgspec.msgpack.Decoder(sglang.load_publisher.LoadStat).decode(payload)
    assert (stat.num_running_reqs, stat.num_waiting_reqs, stat.attn_dp_rank) == (0, 0, 0)
    assert stat.max_total_num_tokens == 1 << 20
    assert stat.max_running_requests == (64 if native else 0), "basic reports carry no native fields"
