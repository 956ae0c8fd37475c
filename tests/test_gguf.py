"""GGUF import: a tiny Llama written as a GGUF file round-trips through convert_gguf."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from thresher.trainers import gguf as tg


def write_gguf(model_dir, path, chat_template: str | None, add_bos: bool | None = None) -> None:
    """Write an HF Llama folder as an F32 GGUF file, the way llama.cpp's converter lays it out."""
    gguf = pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])  # 3: control, 1: normal
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_unk_token_id(tok.unk_token_id)
    if chat_template:
        w.add_chat_template(chat_template)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's rotary layout
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            shape = data.shape
            data = data.reshape(heads, 2, shape[0] // heads // 2, shape[1]).swapaxes(1, 2)
            data = data.reshape(shape)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_round_trip_gives_the_same_model(tmp_path):
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from thresher.trainers.tiny import CHAT_TEMPLATE, make_tiny_model

    src = make_tiny_model(tmp_path / "src", train_steps=0)
    path = tmp_path / "tiny.gguf"
    write_gguf(src, path, CHAT_TEMPLATE)

    out = tg.convert_gguf(path, tmp_path / "converted", dtype="float32")
    assert not (tmp_path / "converted.tmp").exists()
    meta = json.loads((out / tg.SOURCE_FILE).read_text())
    assert meta["sha256"] == tg.sha256_file(path) and meta["dtype"] == "float32"

    ref = AutoModelForCausalLM.from_pretrained(src)
    got = AutoModelForCausalLM.from_pretrained(out)
    tok, ref_tok = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(src)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert tok.chat_template == CHAT_TEMPLATE
    text = "What is 7 * 8? 7 * 8 = 56."
    assert tok(text)["input_ids"] == ref_tok(text)["input_ids"]
    ids = torch.tensor([ref_tok(text)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, ref(ids).logits, atol=1e-4, rtol=1e-4)

    with pytest.raises(FileExistsError):
        tg.convert_gguf(path, out)
    again = tg.convert_gguf(path, out, dtype="bfloat16", overwrite=True)
    assert json.loads((again / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_gguf_that_asks_for_bos_gets_it_before_every_text(tmp_path):
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from thresher.trainers.tiny import make_tiny_model

    src = make_tiny_model(tmp_path / "src", train_steps=0)
    text = "What is 7 * 8?"
    starts = {}
    for asks in (False, True):
        path = tmp_path / f"bos-{asks}.gguf"
        write_gguf(src, path, None, add_bos=asks)
        out = tg.convert_gguf(path, tmp_path / f"converted-{asks}", dtype="float32")
        tok = AutoTokenizer.from_pretrained(out)  # as vLLM and the trainer load it
        starts[asks] = tok(text)["input_ids"][0] == tok.bos_token_id
        assert json.loads((out / tg.SOURCE_FILE).read_text())["bos_added"] == asks
    assert starts == {False: False, True: True}


def test_smollm2_path_and_missing_gguf_errors_are_clear(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from thresher.flows.cli import app

    real_find_spec = tg.importlib.util.find_spec
    missing = {"gguf", tg.SMOLLM2_PACKAGE}
    monkeypatch.setattr(
        tg.importlib.util,
        "find_spec",
        lambda n, *a: None if n in missing else real_find_spec(n, *a),
    )
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        tg.smollm2_gguf_path()
    res = CliRunner().invoke(app, ["import-gguf", "smollm2", str(tmp_path / "m")])
    assert res.exit_code == 1 and "make smollm2" in res.output

    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"GGUF")
    res = CliRunner().invoke(app, ["import-gguf", str(fake), str(tmp_path / "m")])
    assert res.exit_code == 1 and "pip install gguf==0.19.0" in res.output
    assert not (tmp_path / "m").exists()


def test_import_gguf_help_imports_no_heavy_library(tmp_path):
    probe = (
        "import sys\nfrom thresher.flows.cli import app\n"
        "try:\n    app(['import-gguf', '--help'], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'gguf') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "Usage" in res.stdout and res.stdout.strip().endswith("[]"), res.stdout + res.stderr
