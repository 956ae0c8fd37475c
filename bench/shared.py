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


def demo_runs(model: str, rounds: int, folder: str, prefix: str):
    """The demo's bootstrap config for `rounds` rounds of `model` (every round run), and
    the folder its lakes go under (`folder`, else a new one; printed, to resume)."""
    import yaml

    base = yaml.safe_load((ROOT / "configs" / "bootstrap-demo.yaml").read_text())
    base |= {"base_model": word_model(model), "max_rounds": rounds, "min_gain": -1.0,
             "patience": rounds}  # fmt: skip
    tmp = Path(folder) if folder else Path(tempfile.mkdtemp(prefix=prefix))
    print(f"lakes under {tmp} (--dir {tmp} resumes)")
    return base, tmp


def demo_lake(path: Path, train: Path):
    """A lake at `path` with `train` as the word problems' train split and the bundled
    eval split."""
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake

    lake = Lake(path)
    ingest(lake, train, dataset="word-problems", split="train", task="arithmetic")
    ingest(lake, ROOT / "examples" / "word-problems" / "eval.jsonl", dataset="word-problems",
           split="eval", task="arithmetic")  # fmt: skip
    return lake


def print_paired(lakes: dict, label: str) -> None:
    """The last models' paired difference of held-out pass@1, first run minus second, of
    two runs ({pipeline name: lake}) with its 95 % interval."""
    from thresher.evaluators.compare import paired_difference
    from thresher.evaluators.report import eval_prompt_rates

    (a, lake_a), (b, lake_b) = lakes.items()
    diff = paired_difference(eval_prompt_rates(lake_a, a), eval_prompt_rates(lake_b, b))
    row = diff.filter(diff["task"] == "all").to_dicts()[0]
    print(f"\nlast models, {label}: {row['difference']:+.3f} [{row['low']:+.3f}, "
          f"{row['high']:+.3f}] on {row['prompts']} held-out prompts")  # fmt: skip
