"""Engine settings chosen for the model and the machine: the KV cache size, thread binding."""

from __future__ import annotations

import json

from thresher.samplers import vllm_offline
from thresher.samplers.vllm_offline import (
    cpu_dtype,
    kv_bytes_per_token,
    kv_cache_gib,
    threads_bind,
)

# SmolLM2-135M-Instruct's shape (its config.json): 30 layers, 9 heads, 3 KV heads, 576 wide
SMOLLM2 = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
TINY = {
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "hidden_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}


def _model(tmp_path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_kv_bytes_per_token_follow_the_model_shape():
    assert kv_bytes_per_token(SMOLLM2) == 30 * 2 * 3 * 64 * 2  # about 23 KB, as measured
    assert kv_bytes_per_token(SMOLLM2, "float32") == 30 * 2 * 3 * 64 * 4
    assert kv_bytes_per_token(TINY) == 2 * 2 * 2 * 64 * 4


def test_the_cache_fits_the_model_and_the_machine(tmp_path):
    smol = _model(tmp_path, SMOLLM2)
    # 256 sequences of 8,192 tokens want 45 GiB: a quarter of 24 GiB available is the cap
    assert kv_cache_gib(smol, "auto", None, 256, 24.0) == 6
    assert kv_cache_gib(smol, "auto", 1024, 256, 24.0) == 6  # 5.6 GiB wanted, rounded up
    assert kv_cache_gib(smol, "auto", 512, 64, 24.0) == 1  # 0.7 GiB wanted: the floor
    assert kv_cache_gib(smol, "auto", None, 256, 2.0) == 1  # a small host still gets 1 GiB
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    assert kv_cache_gib(_model(tiny, TINY), "auto", None, 256, 24.0) == 1
    assert kv_cache_gib(str(tmp_path / "nowhere"), "auto", None, 256, 24.0) == 1


def test_a_cache_size_the_user_set_is_kept(tmp_path, monkeypatch):
    smol = _model(tmp_path, SMOLLM2)
    monkeypatch.setattr(vllm_offline, "available_gib", lambda: 24.0)
    monkeypatch.setitem(vllm_offline._KV_SET, "value", None)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")  # restored after the test
    vllm_offline._prepare_environment(smol, "auto", None, {})
    assert vllm_offline.os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    vllm_offline._prepare_environment(smol, "auto", None, {})
    assert vllm_offline.os.environ["VLLM_CPU_KVCACHE_SPACE"] == "6"
    # a size this module chose is chosen again for the next engine's model and settings
    vllm_offline._prepare_environment(smol, "auto", None, {"max_num_seqs": 16})
    assert vllm_offline.os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_small_machines_bind_the_engine_threads_to_every_cpu(monkeypatch):
    assert threads_bind([0, 1]) == "0,1"
    assert threads_bind([2, 5, 7]) == "2,5,7"  # the CPUs this process may use, not 0..n
    assert threads_bind(list(range(16))) is None  # larger machines: vLLM's own binding
    monkeypatch.setattr(vllm_offline.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # a user's size: left alone here
    vllm_offline._prepare_environment("nowhere", "auto", None, {})
    assert vllm_offline.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's choice is kept
    vllm_offline._prepare_environment("nowhere", "auto", None, {})
    assert vllm_offline.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_auto_runs_float32_where_the_cpu_has_no_native_bf16():
    avx2_only = {"avx2": True, "avx512_bf16": False, "amx_bf16": False}
    assert cpu_dtype("auto", avx2_only) == "float32"
    assert cpu_dtype("auto", {**avx2_only, "avx512_bf16": True}) == "auto"
    assert cpu_dtype("auto", {"amx_bf16": True}) == "auto"
    assert cpu_dtype("auto", {"bf16": True}) == "auto"  # Arm
    assert cpu_dtype("bfloat16", avx2_only) == "bfloat16"  # asked for: kept
    assert cpu_dtype("auto", {}) == "auto"  # nothing known: vLLM's own choice
