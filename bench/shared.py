"""What several benches share: their command line, the demo's word-problem model, and
fresh lakes of generated word problems."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORD_MODEL = str(ROOT / ".cache" / "word-model")  # where `make demo` builds it


def options(doc: str, **defaults: int | float | str) -> argparse.ArgumentParser:
    """A parser described by the first line of the bench's docstring, with an option per
    keyword of its default's type (`max_tokens=32` is `--max-tokens`, an int)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser


def word_model(path: str) -> str:
    """The demo's word-problem model at `path`, built there first where it is missing."""
    if not (Path(path) / "config.json").exists():
        from thresher.trainers.tiny import make_word_problem_model

        make_word_problem_model(path)
    return path


def word_problems(prefix: str, n: int, seed: int) -> tuple[Path, Path]:
    """A new temporary folder and `n` generated word problems in it: (folder, prompts file)."""
    from thresher.ingest.synthetic import write_word_problems

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    return tmp, write_word_problems(tmp / "prompts.jsonl", n, seed=seed)


def fresh_lake(tmp: Path, source: Path, dataset: str = "bench"):
    """A new lake in its own folder under `tmp`, with `source`'s prompts ingested."""
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake

    lake = Lake(Path(tempfile.mkdtemp(dir=tmp)) / "lake")
    ingest(lake, source, dataset=dataset)
    return lake
