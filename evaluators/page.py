"""The round report: one self-contained HTML page with PNG plots of the bootstrap rounds."""

from __future__ import annotations

import base64
import html
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import polars.selectors as cs

from thresher.evaluators.audit import quality_shown, verifier_disagreement, verifier_quality
from thresher.evaluators.pseudo_labels import majority_accuracy
from thresher.evaluators.report import (
    best_and_rollbacks,
    classes_by_round,
    difficulty_by_round,
    eval_by_round,
    forgetting_by_round,
    funnel_by_round,
    gain_by_task,
    held_out_levels,
    monitors_by_round,
    pass_rates_by_round,
    pipeline_names,
    prior_by_task,
    round_table,
    signal_by_round,
    sources_by_round,
    spend_by_round,
    task_answers_by_round,
    task_frontier_by_round,
    task_pass_by_round,
    test_results,
    test_strength_tables,
    tokens_by_round,
    training_mix,
)
from thresher.stores.lake import Lake

# The plots a report may write, in page order.
PLOTS = ("passk.png", "funnel.png", "pass_rates.png", "tokens.png", "verifier_quality.png")
PLOTS += ("monitors.png",)

# Funnel stages drawn as bars; the rare drops only when some round has them.
FUNNEL_BARS = ("sampled", "passed", "duplicates", "capped", "contaminated", "hinted", "kept")
FUNNEL_RARE = ("truncated_dropped", "too_easy", "hint_share", "answer_share", "suspect_reference")


class NoRounds(ValueError):
    """The lake (or the named pipeline) has neither held-out evals nor curated rounds."""


def write_report(
    lake: Lake | str | os.PathLike, out_dir: str | os.PathLike, name: str | None = None
) -> Path:
    """Write out_dir/index.html and its PNG plots; returns the page's path."""
    lake = lake if isinstance(lake, Lake) else Lake(lake, create=False)
    evals = eval_by_round(lake, name)
    funnel = funnel_by_round(lake, name)
    if evals.is_empty() and funnel.is_empty():
        if test_results(lake, name).is_empty():
            raise NoRounds(no_rounds_message(lake, name))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    plots = dict.fromkeys(PLOTS, "")  # file name -> why it was skipped ("" when drawn)
    best, rolled = best_and_rollbacks(lake, name)
    if evals.is_empty():
        plots["passk.png"] = "No held-out evals (split 'eval', task 'all'): run `thresher eval`."
    else:
        _plot_passk(evals, out / "passk.png", best, rolled)
    if funnel.is_empty():
        note = "No curated rounds (no selections): run `thresher curate` or `thresher bootstrap`."
        plots.update({p: note for p in PLOTS[1:]})
    else:
        _plot_funnel(funnel, out / "funnel.png")
        rates = pass_rates_by_round(lake, name)
        if rates.is_empty():
            plots["pass_rates.png"] = "No unhinted curated candidates: no per-prompt pass rates."
        else:
            _plot_pass_rates(rates, difficulty_by_round(lake, name), out / "pass_rates.png")
        tokens = tokens_by_round(lake, name)
        if tokens.is_empty():
            plots["tokens.png"] = (
                "No token counts (n_tokens is null, e.g. a server that reports no usage)."
            )
        else:
            _plot_tokens(tokens, out / "tokens.png")
    quality = verifier_quality(lake, name)
    if quality.is_empty():
        plots["verifier_quality.png"] = (
            "No labelled candidates: write a sheet with `thresher audit --round R`, label it, "
            "then `thresher audit import FILE`."
        )
    else:
        _plot_quality(quality, out / "verifier_quality.png")
    monitors = monitors_by_round(lake, name)
    _draw_monitors(monitors, out, plots)
    for file, note in plots.items():
        if note:  # a skipped plot: no stale picture from an earlier report
            (out / file).unlink(missing_ok=True)

    page = out / "index.html"
    before_plot = {  # sections that stand just before a plot's heading
        "verifier_quality.png": _audit_section(lake, name, quality),
        "monitors.png": _monitors_section(monitors, name),
    }
    lines = _best_lines(best, rolled)
    table = round_table(lake, name)
    page.write_text(
        _page(lake, name, table, funnel, plots, out, lines, before_plot, evals), "utf-8"
    )
    return page


def no_rounds_message(lake: Lake, name: str | None) -> str:
    """Why there is nothing to report, and what to run first."""
    what = f"for pipeline {name!r} " if name is not None else ""
    message = (
        f"no held-out evals and no curated rounds {what}in lake {lake.root}: "
        "run `thresher bootstrap` or `thresher eval` first"
    )
    if name is not None:
        names = pipeline_names(lake)
        message += f" (pipelines in this lake: {', '.join(names) if names else 'none'})"
    return message


# -- plots (matplotlib's Agg canvas, no pyplot state) ---------------------------------


def _figure(width: float = 7.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _round_axis(ax, rounds: list[int]) -> None:
    ax.set_xticks(rounds)
    ax.set_xlabel("round")
    ax.grid(axis="y", alpha=0.3)


def _plot_passk(
    evals: pl.DataFrame, path: Path, best: int | None = None, rolled: list | None = None
) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    rounds = evals["round"].to_list()
    for metric in [c for c in evals.columns[1:] if not c.startswith("tool ")]:
        # the answer prior is a property of the held-out set: a reference line, not a model's
        style = {"linestyle": "--", "color": "grey"} if metric == "constant-answer" else {}
        ax.plot(rounds, evals[metric].to_list(), marker="o", label=metric, **style)
    if best is not None and "pass@1" in evals.columns:
        value = evals.filter(pl.col("round") == best)["pass@1"][0]
        ax.plot([best], [value], marker="*", markersize=16, color="gold", markeredgecolor="k",
                linestyle="none", label=f"best model (round {best})")  # fmt: skip
    for round_, source in rolled or []:
        ax.axvline(round_, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(f"round {round_} sampled\nwith model {source}", (round_, 0.95),
                    ha="center", va="top", fontsize=8, color="tab:red")  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out pass rate")
    ax.set_title("Held-out pass@k of model r")
    _round_axis(ax, rounds)
    ax.legend()
    fig.savefig(path)


def _plot_funnel(funnel: pl.DataFrame, path: Path) -> None:
    stages = [*FUNNEL_BARS, *(s for s in FUNNEL_RARE if funnel[s].sum() > 0)]
    rounds = funnel["round"].to_list()
    fig = _figure(max(8.0, 0.2 * len(rounds) * len(stages)), 4.0)
    ax = fig.add_subplot()
    width = 0.8 / len(stages)
    for i, stage in enumerate(stages):
        xs = [r - 0.4 + width * (i + 0.5) for r in rounds]
        ax.bar(xs, funnel[stage].to_list(), width, label=stage)
    ax.set_ylabel("candidates")
    ax.set_title("Curation funnel per round")
    _round_axis(ax, rounds)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path)


def _plot_pass_rates(rates: pl.DataFrame, difficulty: pl.DataFrame, path: Path) -> None:
    fig = _figure(10.0, 4.0)
    hist, kinds = fig.subplots(1, 2, width_ratios=[3, 2])
    # grouped bars per tenth of pass rate (0 and 1 fall in the outer bins), a bar per round
    width = 0.1 / (rates["round"].n_unique() + 1)
    for i, ((r,), group) in enumerate(rates.group_by("round", maintain_order=True)):
        bins = (group["pass_rate"] * 10).floor().clip(0, 9).cast(pl.Int64).value_counts()
        xs = [b / 10 + width * (i + 1) for b in bins["pass_rate"]]
        hist.bar(xs, bins["count"].to_list(), width, label=f"round {r}")
    hist.set_xticks([i / 10 for i in range(11)])
    hist.set_xlim(0, 1)
    hist.yaxis.get_major_locator().set_params(integer=True)
    hist.set_xlabel("per-prompt pass rate (unhinted candidates)")
    hist.set_ylabel("prompts")
    hist.set_title("Per-prompt pass rates")
    hist.legend(fontsize="small")
    rounds = difficulty["round"].to_list()
    bottom = [0.0] * len(rounds)
    for kind, color in (("all_fail", "tab:red"), ("mixed", "tab:gray"), ("all_pass", "tab:green")):
        share = [
            k / max(p, 1) for k, p in zip(difficulty[kind], difficulty["prompts"], strict=True)
        ]
        kinds.bar(rounds, share, 0.6, bottom=bottom, label=kind, color=color)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    kinds.set_ylim(0, 1)
    kinds.set_ylabel("share of prompts")
    kinds.set_title("All-pass / mixed / all-fail prompts")
    _round_axis(kinds, rounds)
    kinds.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path)


def _plot_tokens(tokens: pl.DataFrame, path: Path) -> None:
    rounds = sorted(tokens["round"].unique().to_list())
    fig = _figure()
    ax = fig.add_subplot()
    for offset, label, frame, color in (
        (-0.18, "all curated", tokens, "tab:blue"),
        (0.18, "kept", tokens.filter(pl.col("kept")), "tab:green"),
    ):
        data = [frame.filter(pl.col("round") == r)["n_tokens"].to_list() for r in rounds]
        present = [(r, d) for r, d in zip(rounds, data, strict=True) if d]
        if not present:
            continue
        box = ax.boxplot(
            [d for _, d in present],
            positions=[r + offset for r, _ in present],
            widths=0.3,
            patch_artist=True,
            manage_ticks=False,
        )
        for patch in box["boxes"]:
            patch.set(facecolor=color, alpha=0.5)
        box["boxes"][0].set_label(label)
    ax.set_ylabel("tokens per candidate")
    ax.set_title("Candidate length per round")
    _round_axis(ax, rounds)
    ax.legend(fontsize="small")
    fig.savefig(path)


def _plot_quality(quality: pl.DataFrame, path: Path) -> None:
    fig = _figure(10.0, 4.0)
    panels = fig.subplots(1, 2, sharey=True)
    verifiers = quality["verifier"].unique(maintain_order=True).to_list()
    rounds = sorted(quality["round"].unique().to_list())
    for ax, rate, title in (
        (panels[0], "false_pass_rate", "False-pass rate (passed, labelled incorrect)"),
        (panels[1], "false_fail_rate", "False-fail rate (failed, labelled correct)"),
    ):
        for i, v in enumerate(verifiers):
            rows = quality.filter((pl.col("verifier") == v) & pl.col(rate).is_not_null())
            if rows.is_empty():
                continue
            xs = [r + 0.06 * (i - (len(verifiers) - 1) / 2) for r in rows["round"]]
            ys = rows[rate].to_list()
            low = [y - lo for y, lo in zip(ys, rows[f"{rate}_low"], strict=True)]
            high = [hi - y for y, hi in zip(ys, rows[f"{rate}_high"], strict=True)]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=v)
        ax.set_ylim(0, 1)
        ax.set_title(title, fontsize="medium")
        _round_axis(ax, rounds)
    panels[0].set_ylabel("rate (95 % interval)")
    panels[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path)


# -- monitors -------------------------------------------------------------------------

# The monitors' columns, as two tables: diversity and signal; lengths and hints.
MONITOR_TABLES = (
    ("prompts", "candidates", "distinct_answers", "similarity", "top_opening_share",
     "top_closing_share", "mixed_share", "headroom", "headroom_metric"),
    ("all_p50", "all_p90", "kept_p50", "kept_p90", "kept_length_ratio", "hinted_share"),
)  # fmt: skip


def _draw_monitors(monitors: pl.DataFrame, out: Path, plots: dict[str, str]) -> None:
    """monitors.png, or the note saying why there is none."""
    if monitors.is_empty():
        plots["monitors.png"] = (
            "No round monitors: every curate run records them (thresher curate, bootstrap)."
        )
    else:
        plots["monitors.png"] = ""
        _plot_monitors(monitors, out / "monitors.png")


# the monitors plotted as lines of their own: (column, line style, colour)
# fmt: off
SHARE_LINES = (("similarity", "s--", "tab:orange"), ("top_opening_share", "^:", "tab:purple"),
               ("top_closing_share", "v:", "tab:brown"), ("mixed_share", "d-.", "tab:gray"))
LENGTH_LINES = (("all_p50", "o-", "tab:blue"), ("all_p90", "o--", "tab:blue"),
                ("kept_p50", "s-", "tab:green"), ("kept_p90", "s--", "tab:green"))
# fmt: on


def _plot_lines(ax, rows: pl.DataFrame, lines: tuple, tag: str) -> None:
    """One line per (column, style, colour) of `lines`, by round, labelled with its column."""
    rounds = rows["round"].to_list()
    for column, style, color in lines:
        ax.plot(rounds, rows[column].to_list(), style, color=color, label=f"{column}{tag}")


def _plot_monitors(monitors: pl.DataFrame, path: Path) -> None:
    fig = _figure(11.0, 4.0)
    answers, lengths = fig.subplots(1, 2)
    shares = answers.twinx()
    several = monitors["pipeline"].n_unique() > 1
    for (pipeline,), rows in monitors.group_by("pipeline", maintain_order=True):
        tag = f" ({pipeline})" if several else ""
        rounds = rows["round"].to_list()
        answers.plot(rounds, rows["distinct_answers"].to_list(), "o-", color="tab:blue",
                     label=f"distinct answers{tag}")  # fmt: skip
        _plot_lines(shares, rows, SHARE_LINES, tag)
        _plot_lines(lengths, rows, LENGTH_LINES, tag)
        _round_axis(lengths, rounds)
        _round_axis(answers, rounds)
    answers.set_ylabel("distinct final answers per prompt")
    answers.set_ylim(bottom=0)
    shares.set_ylim(0, 1)
    shares.set_ylabel("similarity / share of prompts")
    answers.set_title("Answer diversity and repeated templates", fontsize="medium")
    handles = [h for ax in (answers, shares) for h in ax.get_legend_handles_labels()[0]]
    answers.legend(handles=handles, fontsize="x-small", loc="lower left")
    lengths.set_ylabel("tokens per candidate")
    lengths.set_ylim(bottom=0)
    lengths.set_title("Length: all candidates against the kept ones", fontsize="medium")
    lengths.legend(fontsize="x-small")
    fig.savefig(path)


def _monitors_section(monitors: pl.DataFrame, name: str | None) -> list[str]:
    """The monitors per round, and each round's most repeated opening and closing."""
    parts = [
        "<h2>Monitors</h2>",
        "<p>Per curated round, on its current selection (view <code>round_monitors</code>): "
        "distinct final answers per prompt and the mean pairwise MinHash similarity among a "
        "prompt's candidates (unhinted ones; falling answers and rising similarity are "
        "collapse), the share of prompts with a candidate opening or closing with the most "
        "repeated sentence (a template), tokens per candidate of all and of the kept ones "
        "(p50, p90; kept_length_ratio = kept p50 / all p50), the hinted share of the kept, "
        "held-out pass@k - pass@1 of the model that sampled the round (headroom), and the "
        "share of prompts solved sometimes but not always (mixed). A bootstrap's "
        "<code>monitors:</code> thresholds stop a round before training on it.</p>",
    ]
    if monitors.is_empty():
        return [*parts, '<p class="note">No round monitors recorded yet.</p>']
    keys = ["round"] if name is not None else ["pipeline", "round"]
    for columns in MONITOR_TABLES:  # two tables, each narrow enough for a window
        parts.append(_html_table(monitors.select(*keys, *columns)))
    for row in monitors.iter_rows(named=True):
        which = f"Round {row['round']}" + (f" of {row['pipeline']}" if name is None else "")
        said = [
            f"{what} “{html.escape(row[column])}” ({row[column + '_share']:.0%} of prompts)"
            for what, column in (("opening", "top_opening"), ("closing", "top_closing"))
            if row[column] is not None
        ]
        if said:
            parts.append(f"<p>{html.escape(which)}: most repeated {'; '.join(said)}.</p>")
    return parts


def _audit_section(lake: Lake, name: str | None, quality: pl.DataFrame) -> list[str]:
    """The verifier-quality tables: labelled rates per round and verifier, disagreement
    between verifiers, and how often the majority's pseudo-label was right."""
    parts = [
        "<h2>Verifier quality</h2>",
        "<p>Per round and verifier, on candidates labelled in audits (<code>thresher "
        "audit</code>): false-pass rate = passed among those labelled incorrect, false-fail "
        "rate = failed among those labelled correct, with 95 % Wilson intervals. "
        "<code>rule</code> is the pipeline's selection rule (what decided the training "
        "data). Audit sheets over-sample rare cases, so these are rates among audited "
        "candidates.</p>",
    ]
    if quality.is_empty():
        parts.append('<p class="note">No labelled candidates yet.</p>')
    else:
        shown = quality_shown(quality)
        if name is not None:
            shown = shown.drop("pipeline")
        parts.append(_html_table(shown))
    disagreement = verifier_disagreement(lake, name)
    if not disagreement.is_empty():
        parts.append("<h3>Verifiers disagreeing on the same candidates</h3>")
        parts.append(_html_table(disagreement.drop("pipeline") if name else disagreement))
    majority = majority_accuracy(lake, name)
    if not majority.is_empty():
        parts.append("<h3>Majority pseudo-labels against references</h3>")
        parts.append(
            "<p>Prompts whose <code>majority</code> verdicts name a pseudo-label; where a "
            "reference exists, how often the majority answer was it (95 % interval).</p>"
        )
        parts.append(_html_table(majority))
    return parts


# -- the page -------------------------------------------------------------------------


def _best_lines(best: int | None, rolled: list[tuple]) -> list[str]:
    """The best model on held-out pass@1, and the rounds that rolled back to it."""
    lines = [] if best is None else [f"<p>Best model on held-out pass@1: <b>round {best}</b>.</p>"]
    for round_, source in rolled:
        lines.append(
            f'<p class="note">Round {round_} sampled with model {source}: model {round_} '
            "had regressed (rollback).</p>"
        )
    return lines


def _signal_section(lake: Lake, name: str | None) -> list[str]:
    """Per round: prompts sampled, skipped as solved, retired, and the share in the band."""
    table = signal_by_round(lake, name)
    if table.is_empty() or table["in_band"].null_count() == table.height:
        return []
    return [
        "<h2>Prompts with signal</h2>",
        "<p>in_band: the share of a round's prompts solved sometimes but not always (inside "
        "<code>difficulty.min_pass_rate</code> and <code>max_pass_rate</code>): the ones a "
        "round can learn from. retired: prompts no longer sampled after "
        "<code>difficulty.retire_after</code> rounds without a pass.</p>",
        _html_table(table),
    ]


def _forgetting_section(lake: Lake, name: str | None) -> list[str]:
    """Each forgetting check's pass@1 per round beside the base model's (eval.also)."""
    table = forgetting_by_round(lake, name) if name is not None else pl.DataFrame()
    if table.is_empty():
        return []
    return [
        "<h2>Forgetting checks</h2>",
        "<p>Other held-out sets, evaluated every round beside the main one; drop is the base "
        "model's pass@1 less this round's (a drop over <code>max_drop</code> stops the "
        "run).</p>",
        _html_table(table),
    ]


def _plot_tasks(table: pl.DataFrame, path: Path) -> None:
    fig = _figure()
    ax = fig.add_subplot()
    tasks = table["task"].unique(maintain_order=True).to_list()
    for i, task in enumerate(tasks):
        rows = table.filter(pl.col("task") == task)
        rounds = [r + (i - (len(tasks) - 1) / 2) * 0.04 for r in rows["round"].to_list()]
        mean = rows["pass_at_1"].to_list()
        low = [m - lo for m, lo in zip(mean, rows["low"].clip(0, 1).to_list(), strict=True)]
        high = [h - m for m, h in zip(mean, rows["high"].clip(0, 1).to_list(), strict=True)]
        style = {"color": "k", "linewidth": 2.5} if task == "all" else {}
        ax.errorbar(rounds, mean, yerr=[low, high], marker="o", capsize=3, label=task, **style)
    ax.set_ylim(0, None)
    ax.set_ylabel("held-out pass@1")
    ax.set_title("Held-out pass@1 per task (95 % intervals)")
    _round_axis(ax, sorted(set(table["round"].to_list())))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path)


def _task_section(lake: Lake, name: str | None, out: Path) -> list[str]:
    """Held-out pass@1 per task and round with 95 % intervals (a table and a plot), and the
    last round's gain over the base model on the same prompts."""
    table = task_pass_by_round(lake, name) if name is not None else pl.DataFrame()
    if table.is_empty() or table["task"].n_unique() < 2:
        (out / "tasks.png").unlink(missing_ok=True)
        return []
    _plot_tasks(table, out / "tasks.png")
    picture = base64.b64encode((out / "tasks.png").read_bytes()).decode("ascii")
    shown = table.with_columns(
        cell=pl.format(
            "{} [{}, {}]",
            *(pl.col(c).clip(0, 1).round(3) for c in ("pass_at_1", "low", "high")),
        )
    ).pivot(on="round", index="task", values="cell", sort_columns=True)
    prompts = table.group_by("task").agg(prompts=pl.col("prompts").max())
    shown = prompts.join(shown, on="task").sort(pl.col("task") != "all", "task")
    shown = shown.rename({c: f"round {c}" for c in shown.columns if c.isdigit()})
    parts = [
        "<h2>Per task</h2>",
        "<p>Held-out pass@1 of each round's model per task, with its 95 % interval over "
        "prompts (the mean of per-prompt pass rates).</p>",
        _html_table(shown),
        f'<img alt="Held-out pass@1 per task" src="data:image/png;base64,{picture}">',
    ]
    gain = gain_by_task(lake, name)
    if not gain.is_empty() and gain["round"][0] > 0:
        parts += [
            f"<p>Round {gain['round'][0]} against the base model on the same prompts: gain is "
            "the mean per-prompt difference of pass@1, low and high its paired 95 % interval "
            "(an interval above 0 is a gain the prompts' noise does not explain).</p>",
            _html_table(gain),
        ]
    prior = prior_by_task(lake, name)
    if not prior.is_empty() and (prior["round"].drop_nulls().max() or 0) > 0:
        parts += [
            "<h3>Above the answer prior</h3>",
            "<p>constant_answer is what always answering a task's commonest reference scores "
            "(ca_low, ca_high its 95 % interval); non_modal_* is pass@1 on the prompts whose "
            "reference is another answer, and its paired gain over the base model (nm_low, "
            "nm_high): a gain there is a skill, not a prior learnt.</p>",
            _html_table(prior.with_columns(cs.float().round(3))),
        ]
    return parts


def _frontier_section(lake: Lake, name: str | None, out: Path) -> list[str]:
    """Per round and task: the curriculum level (plotted when an environment generated
    the prompts), the prompts always and never solved, the share in between."""
    table = task_frontier_by_round(lake, name)
    if table.is_empty() or table["task"].n_unique() < 2 and table["level"].is_null().all():
        (out / "levels.png").unlink(missing_ok=True)
        return []
    parts = [
        "<h2>Frontier</h2>",
        "<p>Per round and task: prompts its model always solved (over k) and never solved "
        "carry no training signal and are kept out of training; in_band is the share "
        "between. level is the curriculum level the round's prompts were generated at.</p>",
    ]
    held_out = held_out_levels(lake, name) if name is not None else {}
    if not table["level"].is_null().all():
        fig = _figure()
        ax = fig.add_subplot()
        tasks = table["task"].unique(maintain_order=True).to_list()
        for i, task in enumerate(tasks):
            rows = table.filter(pl.col("task") == task)
            # tasks at one level would hide each other: each line sits a little apart
            shift = 0.06 * (i - (len(tasks) - 1) / 2)
            levels = [None if v is None else v + shift for v in rows["level"].to_list()]
            line = ax.step(rows["round"].to_list(), levels, where="mid", marker="o", label=task)
            if task in held_out:
                ax.axhline(held_out[task] + shift, color=line[0].get_color(), linestyle=":")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("curriculum level")
        ax.set_title("Each task's level per round (dotted: its held-out set's level)")
        parts.append(_rounds_picture(fig, ax, table, out / "levels.png", "Curriculum levels"))
    parts.append(_html_table(table))
    spend = spend_by_round(lake, name) if name is not None else pl.DataFrame()
    if not spend.is_empty():
        parts += [
            "<p>What the samples bought: tokens sampled per kept example, and per point of "
            "held-out pass@1 the model trained on the round gained over the model that "
            "sampled it (empty where it gained nothing).</p>",
            _html_table(spend),
        ]
    return parts


def _sources_parts(lake: Lake, name: str | None) -> list[str]:
    """Per round: kept examples and tokens per source, and the prompts by class (shown when
    a teacher took part)."""
    sources = sources_by_round(lake, name)
    if not sources["source"].str.starts_with("teacher:").any() if not sources.is_empty() else True:
        return []
    return [
        "<h3>Sources</h3>",
        "<p>Per round and source (the student's own samples, hints, each teacher): "
        "candidates, those passing, kept, and the tokens sampled and kept.</p>",
        _html_table(sources),
        "<p>Prompts by class: solved (the student's own samples pass), teachable (a "
        "teacher's do, the student's do not), out of reach (nobody's do).</p>",
        _html_table(classes_by_round(lake, name)),
    ]


def _rounds_picture(fig, ax, table: pl.DataFrame, path: Path, alt: str) -> str:
    """Finish a per-round plot with one line per task (rounds on x, the legend outside),
    save it to `path` and return it as an <img> embedded in the page."""
    _round_axis(ax, sorted(set(table["round"].to_list())))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path)
    picture = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{alt}" src="data:image/png;base64,{picture}">'


def _answers_section(lake: Lake, name: str | None, out: Path) -> list[str]:
    """Per round and task: the top final answer's share among kept candidates against its
    share of the references (a collapse onto one answer shows as the gap)."""
    table = task_answers_by_round(lake, name)
    if table.is_empty() or "kept_top_share" not in table.columns:
        (out / "answers.png").unlink(missing_ok=True)
        return []
    fig = _figure()
    ax = fig.add_subplot()
    for i, task in enumerate(table["task"].unique(maintain_order=True).to_list()):
        rows = table.filter(pl.col("task") == task)
        color = f"C{i % 10}"
        ax.plot(rows["round"].to_list(), rows["kept_top_share"].to_list(), marker="o",
                color=color, label=f"{task}: kept")  # fmt: skip
        if "reference_top_share" in rows.columns:
            ax.plot(rows["round"].to_list(), rows["reference_top_share"].to_list(),
                    linestyle="--", color=color, label=f"{task}: references")  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of the top final answer")
    ax.set_title("Top answer per task: kept candidates against references")
    picture = _rounds_picture(fig, ax, table, out / "answers.png", "Top answer share per task")
    return [
        "<h2>Answer prior per task</h2>",
        "<p>The top final answer's share among each task's kept candidates (solid) and "
        "among its references (dashed); answer_excess is the gap for the kept top answer "
        "(<code>select.answer_balance</code> bounds it, the monitors gate "
        "<code>max_answer_excess</code> stops on it).</p>",
        picture,
        _html_table(table),
    ]


def _tools_section(evals: pl.DataFrame, out: Path) -> list[str]:
    """Per round, when the held-out candidates could run code: calls per candidate, the
    tool's error rate, and the share of all and of passing candidates that used it."""
    cols = [c for c in evals.columns if c.startswith("tool ")]
    if not cols:
        (out / "tools.png").unlink(missing_ok=True)
        return []
    table = evals.select("round", *(c for c in evals.columns if c == "pass@1"), *cols)
    fig = _figure()
    ax = fig.add_subplot()
    rounds = table["round"].to_list()
    for metric in (c for c in cols if c != "tool calls"):
        ax.plot(rounds, table[metric].to_list(), marker="o", label=metric)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share")
    if "tool calls" in cols:
        calls = ax.twinx()
        calls.plot(rounds, table["tool calls"].to_list(), marker="s", color="k",
                   linestyle="--", label="tool calls (right)")  # fmt: skip
        calls.set_ylabel("code runs per candidate")
        calls.set_ylim(bottom=0)
        calls.legend(loc="lower right", fontsize="small")
    ax.set_title("Tool use of held-out candidates per round")
    picture = _rounds_picture(fig, ax, table, out / "tools.png", "Tool use per round")
    return [
        "<h2>Tool use</h2>",
        "<p>Held-out candidates that could run code (<code>sampling.tools</code>): code runs "
        "per candidate, the share of runs that failed or timed out, and the share of all and "
        "of passing candidates that ran code at least once. The tool's output is context, "
        "never a training target. <code>SELECT * FROM tool_calls</code> lists every run.</p>",
        picture,
        _html_table(table.with_columns(cs.float().round(3))),
    ]


def _mix_section(lake: Lake, name: str | None) -> list[str]:
    """Each model's training mix (train.mix), when one was used."""
    mix = training_mix(lake, name)
    if mix.is_empty():
        return []
    return [
        "<h2>Training mix</h2>",
        "<p>The sources each model trained on (<code>train.mix</code>): share is the weight's "
        "share, row_share the rows' (largest remainder, within one row); repeated counts rows "
        "used again because the source had too few.</p>",
        _html_table(mix),
    ]


def _test_section(lake: Lake, name: str | None) -> list[str]:
    """The sealed test split's results, apart from the rounds: opened only by final
    evaluations, every opening counted."""
    results = test_results(lake, name)
    if results.is_empty():
        return []
    n = results.height
    return [
        "<h2>Sealed test split</h2>",
        f"<p>Opened {n} time{'s' if n != 1 else ''} (<code>thresher eval --split test "
        "--final</code>); no round, stop rule or audit reads it. Each look at it spends some "
        "of its independence: open it at milestones.</p>",
        _html_table(results.with_columns(pl.col("opened_at").cast(pl.String))),
    ]


def _strength_section(lake: Lake) -> list[str]:
    """How strong the code prompts' tests are (`thresher tests-audit`), when audited."""
    summary, weak = test_strength_tables(lake)
    if summary.is_empty():
        return []
    parts = [
        "<h2>Test strength</h2>",
        "<p>Per dataset and suite (<code>thresher tests-audit</code>): the share of the "
        "reference solution's mutants the tests kill, likely equivalent mutants left out; "
        "the strengthened suite adds tests made from the reference's answers on mutated "
        "inputs. weak: prompts under 0.8.</p>",
        _html_table(summary),
    ]
    if not weak.is_empty():
        parts += [
            f"<p>Weak prompts (original tests; {weak.height} shown, the weakest first): a "
            "reference that fails its own tests, or a kill rate under 0.8. "
            "<code>select.min_test_strength</code> keeps their candidates out of training.</p>",
            _html_table(weak),
        ]
    return parts


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}"
    return html.escape(str(value))


def _shown_funnel(funnel: pl.DataFrame) -> pl.DataFrame:
    """The funnel as the page shows it: the counts of teachers and hints only where one
    took part, suspect references only where some were dropped (the table stays within
    the page)."""
    rare = (*SOURCE_COUNTS, "suspect_reference")
    quiet = [c for c in rare if c in funnel.columns and not funnel[c].sum()]
    if "taught" in funnel.columns and not funnel["taught"].sum():
        quiet.append("kept_tokens")
    return funnel.drop(quiet)


SOURCE_COUNTS = ("copies_hint", "teacher_share", "taught", "kept_teacher", "kept_teacher_tokens")


def _html_table(df: pl.DataFrame) -> str:
    # a long column name may break after its underscores; a table wider than the page
    # scrolls inside its own box instead of being cut at the page's edge
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in df.iter_rows()
    )
    return (
        f'<div class="table"><table>\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>{rows}</tbody>\n</table></div>"
    )


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 72em;
       color: #222; }
.table { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums;
        font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: right; }
@media (max-width: 1100px) { table { font-size: 0.8em; } th, td { padding: 0.2em 0.3em; } }
th { background: #f3f3f3; vertical-align: bottom; }
img { max-width: 100%; display: block; margin: 1em 0; }
.note { color: #666; font-style: italic; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""

PLOT_TITLES = {
    "passk.png": "Held-out pass@k",
    "funnel.png": "Curation funnel",
    "pass_rates.png": "Per-prompt pass rates",
    "tokens.png": "Tokens per candidate",
    "verifier_quality.png": "Verifier quality per round",
    "monitors.png": "Monitors per round",
}


def _page(
    lake: Lake,
    name: str | None,
    table: pl.DataFrame,
    funnel: pl.DataFrame,
    plots: dict[str, str],
    out: Path,
    best_lines: list[str],
    before_plot: dict[str, list[str]],
    evals: pl.DataFrame,
) -> str:
    title = "thresher report" + (f": {name}" if name is not None else "")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Lake <code>{html.escape(lake.location)}</code>"
        + (f", pipeline <code>{html.escape(name)}</code>" if name is not None else "")
        + f"; written {stamp}.</p>",
        "<h2>Rounds</h2>",
        "<p>Round r's pass@k is model r on held-out prompts (round 0: the base model), the "
        "model that sampled round r's data; that data trains model r+1. Counts are "
        "candidates; prompts, all_pass and all_fail count prompts by their unhinted "
        "candidates.</p>",
        _html_table(table),
        *best_lines,
        *_task_section(lake, name, out),
        *_frontier_section(lake, name, out),
        *_sources_parts(lake, name),
        *_answers_section(lake, name, out),
        *_tools_section(evals, out),
        *_mix_section(lake, name),
        "<h2>Funnel</h2>",
        _html_table(_shown_funnel(funnel))
        if not funnel.is_empty()
        else '<p class="note">No curated rounds.</p>',
        *_signal_section(lake, name),
        *_forgetting_section(lake, name),
        *_test_section(lake, name),
        *_strength_section(lake),
    ]
    for file, note in plots.items():
        parts += before_plot.get(file, [])
        parts.append(f"<h2>{html.escape(PLOT_TITLES[file])}</h2>")
        if note:
            parts.append(f'<p class="note">{html.escape(note)}</p>')
        else:
            data = base64.b64encode((out / file).read_bytes()).decode("ascii")
            parts.append(
                f'<img alt="{html.escape(PLOT_TITLES[file])}" src="data:image/png;base64,{data}">'
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)
