"""Loads the real SGLang and vLLM publisher modules, unmodified, without torch.

Each engine's package `__init__` files import torch and the whole engine; they are
bypassed by registering empty stub packages whose `__path__` points at the real
directories unpacked from the wheels (see fetch_testdata.py), so only the publisher
modules and their light dependencies load.
"""
import dataclasses
import importlib
import logging
import sys
import types
from pathlib import Path
from typing import Union


def _stub(name, path=None, **attrs):
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _Parallel:
    """Rank 0 of 1 everywhere, as SGLang's runtime context reports without DP."""

    num_dp_ranks = attn_dp_size = 1
    attn_dp_rank = dp_rank = pp_rank = attn_tp_rank = attn_cp_rank = 0


def load_sglang(root):
    """SGLang's KV-event and load-feed publisher modules from an unpacked wheel."""
    root = Path(root)
    for dotted in [
        "sglang",
        "sglang.srt",
        "sglang.srt.utils",
        "sglang.srt.disaggregation",
        "sglang.srt.managers",
        "sglang.srt.managers.scheduler_components",
    ]:
        _stub(dotted, root / dotted.replace(".", "/"))
    _stub("sglang.srt.runtime_context", get_parallel=lambda: _Parallel())
    return types.SimpleNamespace(
        kv_events=importlib.import_module("sglang.srt.disaggregation.kv_events"),
        load_publisher=importlib.import_module(
            "sglang.srt.managers.scheduler_components.load_publisher"
        ),
    )


def load_vllm(root):
    """vLLM's KV-event publisher module from an unpacked wheel."""
    root = Path(root)
    for dotted in ["vllm", "vllm.config", "vllm.utils", "vllm.distributed", "vllm.v1", "vllm.v1.core"]:
        _stub(dotted, root / dotted.replace(".", "/"))
    _stub("vllm.logger", init_logger=logging.getLogger)
    _stub("vllm.config.utils", config=lambda cls: dataclasses.dataclass(cls))
    _stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=Union[bytes, int])
    return types.SimpleNamespace(kv_events=importlib.import_module("vllm.distributed.kv_events"))
