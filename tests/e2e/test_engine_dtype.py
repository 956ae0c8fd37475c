"""`dtype: auto` on the real engine: the dtype the CPU computes natively."""

import torch

from thresher.samplers.vllm_offline import cpu_dtype, get_engine, sample, shutdown_engine


def test_auto_runs_in_the_dtype_this_cpu_computes(tiny_model):
    # vLLM's own `auto` casts the tiny model's float32 down to bf16, whatever the CPU
    expected = torch.float32 if cpu_dtype("auto") == "float32" else torch.bfloat16
    try:
        llm = get_engine(str(tiny_model), max_model_len=256)
        assert llm.llm_engine.model_config.dtype == expected
        outs = sample(
            llm, ["What is 1 + 1?"], k=2, max_tokens=8, temperature=0.8, top_p=0.9, top_k=0
        )
        assert [len(o) for o in outs] == [2] and all(c.n_tokens > 0 for c in outs[0])
    finally:
        shutdown_engine()
