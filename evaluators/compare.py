"""Two runs' models on the same held-out prompts: the per-task difference of pass@1,
paired over prompts, with its 95 % interval (the runs may live in different lakes).

    python -m thresher.evaluators.compare LAKE_A NAME_A LAKE_B NAME_B [--round-a R] [--round-b R]
        [--lenient] [--non-modal]
"""

from __future__ import annotations

import argparse

import polars as pl

from thresher.evaluators.report import Z95, eval_prompt_rates, modal_flags
from thresher.stores.lake import Lake


def paired_difference(
    a: pl.DataFrame, b: pl.DataFrame, round_a: int | None = None, round_b: int | None = None
) -> pl.DataFrame:
    """Per task (and "all"): pass@1 of run a's model `round_a` (default: its last) and run
    b's model `round_b` on the prompts both evaluated, their difference a - b and its
    paired 95 % interval; `a` and `b` are `eval_prompt_rates` frames."""
    ra = a["round"].max() if round_a is None else round_a
    rb = b["round"].max() if round_b is None else round_b
    left = a.filter(pl.col("round") == ra).select("prompt_id", "task", a="rate")
    right = b.filter(pl.col("round") == rb).select("prompt_id", b="rate")
    both = left.join(right, on="prompt_id").with_columns(diff=pl.col("a") - pl.col("b"))
    both = pl.concat([both.with_columns(task=pl.lit("all")), both])
    out = both.group_by("task").agg(
        prompts=pl.len(),
        a=pl.col("a").mean(),
        b=pl.col("b").mean(),
        difference=pl.col("diff").mean(),
        sd=pl.col("diff").std(),
    )
    half = Z95 * pl.col("sd").fill_null(0) / pl.col("prompts").sqrt()
    return (
        out.with_columns(
            low=pl.col("difference") - half,
            high=pl.col("difference") + half,
            round_a=pl.lit(ra),
            round_b=pl.lit(rb),
        )
        .drop("sd")
        .sort(pl.col("task") != "all", "task")
    )


def non_modal_prompts(rates: pl.DataFrame) -> list[str]:
    """The prompts of an `eval_prompt_rates` frame whose reference is not their task's
    commonest answer."""
    return modal_flags(rates).filter(~pl.col("modal"))["prompt_id"].unique().to_list()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake_a")
    parser.add_argument("name_a")
    parser.add_argument("lake_b")
    parser.add_argument("name_b")
    parser.add_argument("--round-a", type=int, default=None, help="default: its last model")
    parser.add_argument("--round-b", type=int, default=None, help="default: its last model")
    parser.add_argument(
        "--lenient",
        action="store_true",
        help="judge without the asked format where the evaluations judged it (answer_format)",
    )
    parser.add_argument(
        "--non-modal",
        action="store_true",
        help="only the prompts whose reference is not their task's commonest answer (a gain "
        "there is a skill, not an answer prior)",
    )
    args = parser.parse_args()
    a = eval_prompt_rates(Lake(args.lake_a, create=False), args.name_a, args.lenient)
    b = eval_prompt_rates(Lake(args.lake_b, create=False), args.name_b, args.lenient)
    if args.non_modal:
        a = a.filter(pl.col("prompt_id").is_in(non_modal_prompts(a)))
    if a.is_empty() or b.is_empty():
        raise SystemExit("both runs need held-out evaluations (thresher report shows them)")
    table = paired_difference(a, b, args.round_a, args.round_b)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, float_precision=3, tbl_hide_dataframe_shape=True):
        print(f"a = {args.name_a} ({args.lake_a}), b = {args.name_b} ({args.lake_b})")
        print(table)


if __name__ == "__main__":
    main()
