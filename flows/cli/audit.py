"""Audit commands: write a sheet of a round's candidates to label, import the labels,
show how often each verifier is wrong, and gate a round on it."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from thresher.flows.cli import LakeOption, OutputFormat, app, fail, print_frame

audit_app = typer.Typer(
    help=(
        "Know when a verifier is wrong before the model learns from it.\n\n"
        "`thresher audit --round R` writes an audit sheet: a stratified sample of round R's "
        "candidates (each verifier's passes and failures, kept and dropped, hinted, "
        "candidates the verifiers disagree on, answers cut at max_tokens) as an HTML page "
        "to label in a browser (its Export CSV button writes the file to import) and the "
        "same rows as CSV for a spreadsheet. Then `thresher audit import FILE` stores the "
        "labels, `thresher audit quality` shows false-pass and false-fail rates, precision "
        "and recall per verifier and round with 95 % intervals, and `thresher audit check "
        "--max-false-pass 0.02` exits non-zero when a round's rate is over it. `thresher "
        "audit flags` lists reworded evaluation items and suspect references with their "
        "evidence; a suspect reference is on its round's sheet, to be labelled right or wrong."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(audit_app, name="audit")

NameOption = Annotated[
    str | None,
    typer.Option(
        "--name",
        "-n",
        help="The curate pipeline (config `name`); default: the only one that curated the round.",
        show_default=False,
    ),
]
OnlyRound = Annotated[
    int | None, typer.Option("--round", "-r", help="Only this round.", show_default=False)
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f")]


@audit_app.callback()
def audit(
    ctx: typer.Context,
    round_: Annotated[
        int | None, typer.Option("--round", "-r", help="The round to audit.", show_default=False)
    ] = None,
    name: NameOption = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Candidates on the sheet.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the draw within each stratum.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder for the sheets.",
            show_default="<lake>/audits, or ./audits for a remote lake",
        ),
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Write an audit sheet (HTML and CSV) of a round's candidates."""
    if ctx.invoked_subcommand is not None:
        return
    if round_ is None:
        typer.echo(ctx.get_help())
        fail("--round is required to write a sheet", code=2)
    from thresher.evaluators.audit import AuditError  # local: fast --help
    from thresher.evaluators.audit_sheet import write_sheet
    from thresher.stores.lake import Lake

    try:
        lk = Lake(lake, create=False)
        sheet = write_sheet(lk, round_, out or lk.local_dir("audits"), name, n, seed)
    except (AuditError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(f"{sheet.rows} candidates on sheet {sheet.sheet_id}, by stratum:")
    for stratum, count in sheet.strata.items():
        typer.echo(f"  {count:5d}  {stratum}")
    typer.echo(f"wrote {sheet.html}\n      {sheet.csv}")
    typer.echo("label it (open the HTML page, or fill the CSV's label column with correct or")
    typer.echo(f"incorrect), then: thresher audit import FILE --lake {lk.location}")


@audit_app.command("import")
def import_cmd(
    path: Annotated[Path, typer.Argument(help="A label CSV: an audit sheet's CSV, filled in.")],
    who: Annotated[
        str | None,
        typer.Option(
            help="Who labelled rows whose `who` is empty.",
            show_default="$THRESHER_USER, else the login name",
        ),
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Store the labels of a filled-in sheet in the `labels` table.

    Needs the columns candidate_id and label (correct or incorrect; also yes/no, right/
    wrong, 1/0); note, who and labelled_at are read when present. Rows without a label are
    skipped; unreadable rows go to `rejects`. Importing the same file twice adds nothing.
    """
    from thresher.ingest.labels import LabelFileError, import_labels  # local: fast --help
    from thresher.stores.lake import Lake

    try:
        done = import_labels(Lake(lake, create=False), path, who)
    except (LabelFileError, FileNotFoundError) as e:
        fail(str(e), code=2)
    typer.echo(
        f"{done.imported} labels imported, {done.already} already in the lake, "
        f"{done.unlabelled} rows without a label, {done.rejected} rejected"
    )
    if done.references:
        typer.echo(
            f"{done.references} reference labels imported: a reference labelled wrong is "
            "judged by its right answer from the next verification on"
        )
    for reason in done.reasons[:10]:
        typer.echo(f"  rejected {reason}", err=True)
    if done.rejected > 10:
        typer.echo(f"  ... {done.rejected - 10} more in the rejects table", err=True)


@audit_app.command()
def quality(
    name: NameOption = None,
    round_: OnlyRound = None,
    fmt: FormatOption = OutputFormat.table,
    lake: LakeOption = None,
) -> None:
    """Per verifier and round: labelled candidates, false-pass and false-fail rates,
    precision and recall (95 % Wilson intervals), then how often verifiers disagree.

    false-pass rate: passed among the candidates labelled incorrect; false-fail rate:
    failed among those labelled correct. `rule` is the pipeline's selection rule.
    """
    from thresher.evaluators.audit import (  # local: fast --help
        quality_shown,
        verifier_disagreement,
        verifier_quality,
    )
    from thresher.stores.lake import Lake

    try:
        lk = Lake(lake, create=False)
        q = verifier_quality(lk, name, round_)
        d = verifier_disagreement(lk, name, round_)
    except FileNotFoundError as e:
        fail(str(e))
    if fmt is not OutputFormat.table:
        print_frame(q, fmt)
        return
    if q.is_empty():
        typer.echo("no labelled candidates yet: thresher audit --round R, then audit import")
    else:
        print_frame(quality_shown(q), fmt)
    if not d.is_empty():
        typer.echo("\nverifiers disagreeing on the same candidates:")
        print_frame(d, fmt)


class FlagKind(StrEnum):
    reworded = "reworded"
    references = "references"


# kind -> (view, order, what to say when it is empty, the columns a table shows)
FLAG_VIEWS = {
    FlagKind.reworded: ("contamination", "round, similarity DESC",
                        "no reworded evaluation items found (is decontaminate.semantic set?)",
                        ("round", "prompt", "eval_prompt", "similarity", "agreed", "dropped")),
    FlagKind.references: ("suspect_references", "round, share DESC, prompt_id",
                          "no suspect references",
                          ("round", "prompt_id", "prompt", "reference", "agreed_answer", "share",
                           "samples", "dropped", "label", "labelled_answer")),
}  # fmt: skip


@audit_app.command()
def flags(
    kind: Annotated[
        FlagKind | None,
        typer.Argument(help="Only these flags (default: both).", show_default=False),
    ] = None,
    round_: OnlyRound = None,
    fmt: FormatOption = OutputFormat.table,
    lake: LakeOption = None,
) -> None:
    """What selection flagged, with its evidence.

    reworded: training prompts dropped as reworded evaluation items
    (`decontaminate.semantic`), each beside the item it rewords, their similarity, what
    agreed and the candidates dropped (the `contamination` view).

    references: prompts whose samples agree on another answer than their reference
    (`select.suspects`): the agreed answer, its share, the samples and models, and any
    label since (the `suspect_references` view). They are on the round's audit sheet
    (`thresher audit --round R`): label the reference right, or wrong with the right
    answer, and import the sheet; a relabelled prompt is judged by its right answer from
    then on."""
    from thresher.evaluators.audit import flag_rows  # local: fast --help
    from thresher.stores.lake import Lake

    kinds = [kind] if kind is not None else list(FlagKind)
    if len(kinds) > 1 and fmt is not OutputFormat.table:
        fail("--format csv or json shows one kind: name it (reworded or references)", code=2)
    try:
        lk = Lake(lake, create=False)
        for k in kinds:
            view, order, empty, shown = FLAG_VIEWS[k]
            rows = flag_rows(lk, view, order, round_)
            if len(kinds) > 1:
                typer.echo(f"{k.value}:")
            if fmt is not OutputFormat.table:
                print_frame(rows, fmt)
            elif rows.is_empty():
                typer.echo(empty)
            else:  # the columns that fit; csv and json have every one
                print_frame(rows.select(shown), fmt)
    except FileNotFoundError as e:
        fail(str(e))


@audit_app.command()
def check(
    max_false_pass: Annotated[
        float,
        typer.Option(
            "--max-false-pass",
            min=0,
            max=1,
            help="Most false-pass rate allowed (passed among candidates labelled incorrect).",
        ),
    ],
    name: NameOption = None,
    round_: Annotated[
        int | None,
        typer.Option(
            "--round", "-r", help="The round to check.", show_default="the latest curated round"
        ),
    ] = None,
    verifier: Annotated[
        list[str] | None,
        typer.Option(
            "--verifier",
            "-v",
            help="Verifier to check (repeatable); default: rule (the selection rule, what "
            "decides the training data).",
            show_default=False,
        ),
    ] = None,
    min_labels: Annotated[
        int, typer.Option(min=1, help="Fewer labelled candidates than this fails the check.")
    ] = 20,
    lake: LakeOption = None,
) -> None:
    """Exit 1 when a round's labelled false-pass rate is over --max-false-pass (or it has
    too few labels to tell), 0 when it holds: a gate for schedules and CI before training."""
    from thresher.evaluators.audit import (  # local: fast --help
        AuditError,
        check_round,
        latest_round,
    )
    from thresher.stores.lake import Lake

    try:
        lk = Lake(lake, create=False)
        r = latest_round(lk, name) if round_ is None else round_
        result = check_round(lk, name, r, max_false_pass, min_labels, verifier)
    except (AuditError, FileNotFoundError) as e:
        fail(str(e))
    for line in result.lines:
        typer.echo(f"round {r} {line}")
    if not result.passed:
        fail(f"audit check failed for round {r}")
    typer.echo(f"audit check passed for round {r}")
