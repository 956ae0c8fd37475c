"""Audit sheets: a stratified sample of one round's candidates to label by hand.

`draw_sample` picks a stratified sample of one round's candidates (each verifier's passes
and failures, kept and dropped, hinted, candidates the verifiers disagree on, answers cut
at max_tokens), `write_sheet` writes it as a self-contained HTML page to label in a browser
plus the same rows as CSV (`thresher audit import` reads the labelled CSV back).

A candidate's verdicts are the ones the selection's curate run read (see `audit`).
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from thresher.evaluators.audit import RULE, resolve_pipeline
from thresher.ids import seeded_key
from thresher.stores.lake import SELECTION_VERDICTS_SQL, Lake
from thresher.stores.queries import current_selection_id, suspect_flags

# Strata that are rare and where verifiers go wrong first; every other candidate falls
# in the stratum of its verdicts (passed/failed) and whether it was kept.
DISAGREE, TRUNCATED, HINTED = "verifiers disagree", "cut at max_tokens", "hinted"
# Candidates of prompts whose samples agree on another answer than the reference: every
# such prompt is on the sheet, so a person can say whether its reference is right.
SUSPECT = "suspect reference"
REFERENCE_COLUMNS = ("agreed_answer", "reference_label", "right_answer")


# Each candidate of a selection with its prompt and the latest verdict of each verifier
# its pipeline used.
CANDIDATE_VERDICTS_SQL = f"""
WITH {SELECTION_VERDICTS_SQL}
SELECT s.candidate_id, s.prompt_id, s.round, s.pipeline, s.kept, s.drop_reason,
       s.drop_reason IS DISTINCT FROM 'failed' AS rule_passed,
       c.text, c.finish_reason, coalesce(c.hinted, false) AS hinted, c.sample_idx,
       c.segments, p.prompt, p.messages, p.answer AS reference,
       list({{'verifier': v.verifier, 'passed': v.passed, 'reason': v.reason}}
            ORDER BY v.verifier) FILTER (WHERE v.verifier IS NOT NULL) AS verdicts
FROM current_selections s JOIN candidates c USING (candidate_id)
LEFT JOIN prompts p ON p.prompt_id = s.prompt_id
LEFT JOIN sel_verdicts v ON v.candidate_id = s.candidate_id
    AND v.selection_id = s.selection_id
WHERE s.round = $round AND s.pipeline IS NOT DISTINCT FROM $pipeline
GROUP BY ALL
ORDER BY s.prompt_id, hinted, c.sample_idx
"""


def round_candidates(lake: Lake, round_: int, name: str | None) -> pl.DataFrame:
    """The pipeline's candidates of one round with prompt, reference, verdicts and stratum."""
    rows = lake.query(CANDIDATE_VERDICTS_SQL, {"round": round_, "pipeline": name})
    sid = current_selection_id(lake, name, round_)
    flags = suspect_flags(lake, sid) if sid else {}
    rows = rows.with_columns(
        pl.Series("agreed_answer", [flags.get(p) for p in rows["prompt_id"].to_list()], pl.String)
    )
    return rows.with_columns(
        pl.Series("stratum", [stratum(r) for r in rows.iter_rows(named=True)], pl.String)
    )


def stratum(row: dict) -> str:
    """The stratum a candidate is drawn from: the rarest thing about it first."""
    if row.get("agreed_answer") is not None:
        return SUSPECT
    verdicts = row["verdicts"] or []
    if len({v["passed"] for v in verdicts}) > 1:
        return DISAGREE
    if row["finish_reason"] == "length":
        return TRUNCATED
    if row["hinted"]:
        return HINTED
    names = "+".join(v["verifier"] for v in verdicts) or "no verdicts"
    outcome = "passed" if row["rule_passed"] else "failed"
    return f"{names} {outcome}, {'kept' if row['kept'] else 'dropped'}"


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many to draw from each stratum: equal shares of `n`, a small stratum taken
    whole and its unused share spread over the others."""
    take = dict.fromkeys(sizes, 0)
    left, open_ = n, sorted(sizes, key=lambda s: (sizes[s], s))
    while left > 0 and open_:
        share = max(left // len(open_), 1)
        for s in list(open_):
            add = min(share, sizes[s] - take[s], left)
            take[s] += add
            left -= add
            if take[s] == sizes[s]:
                open_.remove(s)
            if left == 0:
                break
    return take


def draw_sample(candidates: pl.DataFrame, n: int, seed: int = 0) -> pl.DataFrame:
    """A stratified sample of `n` candidates (all of them when there are fewer), with each
    row's stratum size and weight (stratum size / drawn from it), in prompt order."""
    sizes = dict(candidates.group_by("stratum").len().iter_rows())
    take = allocate(sizes, n)
    keyed = candidates.with_columns(
        pl.col("candidate_id").map_elements(lambda c: seeded_key(seed, c), pl.String).alias("_k")
    )
    parts = []
    for s, k in take.items():
        if k:
            part = keyed.filter(pl.col("stratum") == s).sort("_k").head(k)
            parts.append(part.with_columns(stratum_size=sizes[s], weight=sizes[s] / k))
    if not parts:
        return candidates.clear()
    sample = pl.concat(parts)
    missing = keyed.filter(
        (pl.col("stratum") == SUSPECT) & ~pl.col("prompt_id").is_in(sample["prompt_id"])
    )
    if missing.height:  # every suspect prompt is on the sheet, once at least
        extra = missing.sort("_k").unique("prompt_id", keep="first", maintain_order=True)
        sample = pl.concat([sample, extra.with_columns(stratum_size=0, weight=0.0)])
        taken = sample.filter(pl.col("stratum") == SUSPECT).height
        sample = sample.with_columns(
            pl.when(pl.col("stratum") == SUSPECT)
            .then(pl.lit(sizes[SUSPECT] / taken))
            .otherwise(pl.col("weight"))
            .alias("weight"),
            pl.when(pl.col("stratum") == SUSPECT)
            .then(pl.lit(sizes[SUSPECT]))
            .otherwise(pl.col("stratum_size"))
            .alias("stratum_size"),
        )
    return sample.drop("_k").sort("prompt_id", "hinted", "sample_idx")


def prompt_text(prompt: str | None, messages: str | None) -> str:
    """The prompt as a person reads it: the text, or the chat turns one per line."""
    if prompt:
        return prompt
    try:
        turns = json.loads(messages or "[]")
        return "\n".join(f"{t.get('role')}: {t.get('content')}" for t in turns)
    except (ValueError, AttributeError):
        return messages or ""


# -- the sheet ------------------------------------------------------------------------

SHEET_COLUMNS = (
    "sheet_id",
    "candidate_id",
    "round",
    "pipeline",
    "prompt_id",
    "stratum",
    "weight",
    "prompt",
    "reference",
    "candidate",
    "finish_reason",
    "hinted",
    "kept",
    "drop_reason",
)
LABEL_COLUMNS = ("label", "note", "who", "labelled_at")


@dataclass
class Sheet:
    """A written audit sheet."""

    sheet_id: str
    html: Path
    csv: Path
    rows: int
    strata: dict[str, int]


def sheet_rows(sample: pl.DataFrame, sheet_id: str) -> tuple[list[str], list[dict]]:
    """The sheet's columns and rows: the fixed columns, `<verifier>` (pass/fail) and
    `<verifier>_reason` per verifier, `rule`, `segments` where candidates ran code (their
    turns as JSON), then the columns a labeller fills."""
    verifiers = sorted({v["verifier"] for vs in sample["verdicts"].to_list() if vs for v in vs})
    tools = "segments" in sample.columns and sample["segments"].is_not_null().any()
    suspects = "agreed_answer" in sample.columns and sample["agreed_answer"].is_not_null().any()
    columns = [*SHEET_COLUMNS, RULE, *(["segments"] if tools else [])]
    for v in verifiers:
        columns += [v, f"{v}_reason"]
    columns += LABEL_COLUMNS
    columns += REFERENCE_COLUMNS if suspects else ()
    out = []
    for r in sample.iter_rows(named=True):
        row = {
            "sheet_id": sheet_id,
            "candidate_id": r["candidate_id"],
            "round": r["round"],
            "pipeline": r["pipeline"],
            "prompt_id": r["prompt_id"],
            "stratum": r["stratum"],
            "weight": round(r["weight"], 4),
            "prompt": prompt_text(r["prompt"], r["messages"]),
            "reference": r["reference"],
            "candidate": r["text"],
            "finish_reason": r["finish_reason"],
            "hinted": r["hinted"],
            "kept": r["kept"],
            "drop_reason": r["drop_reason"],
            RULE: "pass" if r["rule_passed"] else "fail",
            "segments": r.get("segments") or "",
            **dict.fromkeys(LABEL_COLUMNS + REFERENCE_COLUMNS, ""),
            "agreed_answer": r.get("agreed_answer") or "",
        }
        for v in r["verdicts"] or []:
            row[v["verifier"]] = "pass" if v["passed"] else "fail"
            row[f"{v['verifier']}_reason"] = v["reason"]
        out.append({c: row.get(c, "") for c in columns})
    return columns, out


def write_sheet(
    lake: Lake, round_: int, out_dir: str | Path, name: str | None = None, n: int = 200,
    seed: int = 0,
) -> Sheet:  # fmt: skip
    """Draw `n` candidates of the round and write the HTML and CSV audit sheets."""
    name = resolve_pipeline(lake, round_, name)
    candidates = round_candidates(lake, round_, name)
    sample = draw_sample(candidates, n, seed)
    ids = sorted(sample["candidate_id"].to_list())
    sheet_id = hashlib.blake2b(
        json.dumps([name, round_, seed, ids]).encode(), digest_size=6
    ).hexdigest()
    columns, rows = sheet_rows(sample, sheet_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"audit-{_slug(name)}-round-{round_}"
    csv_path, html_path = out / f"{stem}.csv", out / f"{stem}.html"
    csv_path.write_text(_csv_text(columns, rows), "utf-8")
    title = f"Audit: {name}, round {round_}"
    html_path.write_text(sheet_html(title, sheet_id, columns, rows, csv_path.name), "utf-8")
    strata = dict(sample.group_by("stratum").len().sort("stratum").iter_rows())
    return Sheet(sheet_id, html_path, csv_path, len(rows), strata)


def _slug(name: str | None) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in str(name or "none"))


def _csv_text(columns: list[str], rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


SHEET_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
header { position: sticky; top: 0; background: #fff; padding: 0.5em 0;
         border-bottom: 1px solid #ccc; z-index: 1; }
.row { border: 1px solid #ccc; border-radius: 6px; margin: 1em 0; padding: 0.6em 0.9em; }
.row.labelled { border-color: #7a7; background: #f6fbf6; }
.meta { color: #666; font-size: 0.85em; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f6f6; padding: 0.4em;
      margin: 0.3em 0; max-height: 20em; overflow: auto; }
.seg-label { color: #666; font-size: 0.8em; margin-top: 0.2em; }
pre.seg-code { background: #eef3fb; } pre.seg-output { background: #fdf6e3; color: #555; }
.verdicts td { padding: 0.1em 0.6em 0.1em 0; vertical-align: top; font-size: 0.9em; }
.pass { color: #176317; font-weight: 600; } .fail { color: #a31515; font-weight: 600; }
.choice label { margin-right: 1.2em; } input.note { width: 30em; max-width: 90%; }
button { font-size: 1em; padding: 0.3em 1em; }
"""

SHEET_SCRIPT = """
const SHEET = JSON.parse(document.getElementById('sheet-data').textContent);
const KEY = 'thresher-audit-' + SHEET.sheet_id;
const saved = JSON.parse(localStorage.getItem(KEY) || '{}');
const rows = () => Array.from(document.querySelectorAll('.row'));
function state() {
  const out = {who: document.getElementById('who').value, labels: {}};
  for (const r of rows()) {
    const id = r.dataset.id;
    const chosen = r.querySelector('input.cand:checked');
    const note = r.querySelector('input.note').value;
    const ref = r.querySelector('input.ref:checked');
    const right = r.querySelector('input.right');
    if (chosen || note || ref) out.labels[id] = {label: chosen ? chosen.value : '', note: note,
      ref: ref ? ref.value : '', right: right ? right.value : '',
      at: (saved.labels && saved.labels[id] && saved.labels[id].at) || ''};
  }
  return out;
}
function refresh() {
  let n = 0;
  for (const r of rows()) {
    const done = !!r.querySelector('input.cand:checked, input.ref:checked');
    r.classList.toggle('labelled', done);
    n += done;
  }
  document.getElementById('progress').textContent = n + ' of ' + rows().length + ' labelled';
}
function save(ev) {
  const s = state();
  if (ev && ev.target && ev.target.type === 'radio') {
    s.labels[ev.target.closest('.row').dataset.id].at = new Date().toISOString();
  }
  saved.labels = s.labels; saved.who = s.who;
  localStorage.setItem(KEY, JSON.stringify(saved));
  refresh();
}
function cell(v) {
  const s = v === null || v === undefined ? '' : String(v);
  return /[",\\n\\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
}
function exportCsv() {
  const s = state();
  const lines = [SHEET.columns.map(cell).join(',')];
  for (const row of SHEET.rows) {
    const got = s.labels[row.candidate_id] || {};
    const done = got.label || got.ref;
    const filled = Object.assign({}, row, {label: got.label || '', note: got.note || '',
      reference_label: got.ref || '', right_answer: got.ref === 'wrong' ? got.right || '' : '',
      who: done ? s.who : '', labelled_at: done ? got.at || '' : ''});
    lines.push(SHEET.columns.map(c => cell(filled[c])).join(','));
  }
  const blob = new Blob([lines.join('\\n') + '\\n'], {type: 'text/csv'});
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = SHEET.download;
  document.body.appendChild(a); a.click(); a.remove();
}
document.getElementById('who').value = saved.who || '';
for (const r of rows()) {
  const got = (saved.labels || {})[r.dataset.id];
  if (got) {
    if (got.label) r.querySelector('input.cand[value=' + got.label + ']').checked = true;
    if (got.ref) r.querySelector('input.ref[value=' + got.ref + ']').checked = true;
    const right = r.querySelector('input.right');
    if (got.right && right) right.value = got.right;
    r.querySelector('input.note').value = got.note || '';
  }
}
document.addEventListener('change', save);
document.addEventListener('input', e => {
  if (e.target.matches('input.note, input.right, #who')) save(e);
});
document.getElementById('export').addEventListener('click', exportCsv);
refresh();
"""


def _tags(row: dict) -> list[str]:
    """What else is rare about a candidate, beside its stratum."""
    tags = [TRUNCATED] if row["finish_reason"] == "length" else []
    tags += [HINTED] if row["hinted"] else []
    return [t for t in tags if t != row["stratum"]]


def _json_for_script(value: object) -> str:
    # inside <script>, "</" would end the element early
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


SEGMENT_LABELS = {"code": "code it ran", "output": "tool output (not the model's)"}


def _candidate_html(row: dict) -> str:
    """The candidate as one block, or where it ran code, its turns one block each: the
    model's text, the code it ran and the tool's output, each labelled."""
    e = html.escape
    if not row.get("segments"):
        return f"<pre>{e(str(row['candidate']))}</pre>"
    parts = []
    for seg in json.loads(row["segments"]):
        kind = seg.get("kind", "text")
        label = SEGMENT_LABELS.get(kind)
        status = f" · {e(str(seg['status']))}" if kind == "output" and seg.get("status") else ""
        head = f'<div class="seg-label">{e(label)}{status}</div>' if label else ""
        parts.append(f'{head}<pre class="seg-{e(kind)}">{e(seg.get("text", ""))}</pre>')
    return "".join(parts)


def _reference_html(row: dict) -> str:
    """For a prompt whose samples agree on another answer: is its reference right?"""
    if not row.get("agreed_answer"):
        return ""
    e, cid = html.escape, html.escape(row["candidate_id"])
    return (
        f'<div class="choice suspect">The samples agree on <b>{e(row["agreed_answer"])}</b>, '
        f"the reference says <b>{e(str(row['reference']))}</b>. Is the reference right? "
        f'<label><input class="ref" type="radio" name="ref-{cid}" value="right"> right</label>'
        f'<label><input class="ref" type="radio" name="ref-{cid}" value="wrong"> wrong, '
        f"the right answer is</label>"
        f'<input class="right" type="text" placeholder="the right answer"></div>'
    )


def sheet_html(
    title: str, sheet_id: str, columns: list[str], rows: list[dict], csv_name: str
) -> str:
    """The audit sheet page: a card per candidate with a correct/incorrect choice and a
    note, kept in the browser's storage, and a button that exports the CSV to import."""
    e = html.escape
    fixed = (*SHEET_COLUMNS, *LABEL_COLUMNS, *REFERENCE_COLUMNS, RULE, "segments")
    verifiers = [c for c in columns if c not in fixed]
    verifiers = [c for c in verifiers if not c.endswith("_reason")]
    cards = []
    for i, r in enumerate(rows, 1):
        cid = e(r["candidate_id"])
        verdicts = "".join(
            f'<tr><td>{e(v)}</td><td class="{r[v]}">{e(r[v])}</td>'
            f"<td>{e(str(r.get(v + '_reason', '')))}</td></tr>"
            for v in verifiers
            if r.get(v)
        )
        verdicts += (
            f'<tr><td>{RULE}</td><td class="{r[RULE]}">{e(r[RULE])}</td>'
            f"<td>{'kept' if r['kept'] else e('dropped: ' + str(r['drop_reason']))}</td></tr>"
        )
        cards.append(
            f'<div class="row" data-id="{cid}" id="row-{i}">'
            f'<div class="meta">#{i} · candidate <code>{cid}</code> · prompt '
            f"<code>{e(r['prompt_id'])}</code> · stratum: {e(r['stratum'])}"
            f"{''.join(f' · {t}' for t in _tags(r))}</div>"
            f"<div><b>Prompt</b><pre>{e(str(r['prompt']))}</pre></div>"
            f"<div><b>Reference</b><pre>{e(str(r['reference'] or '(none)'))}</pre></div>"
            f"<div><b>Candidate</b>{_candidate_html(r)}</div>"
            f'<table class="verdicts">{verdicts}</table>'
            f'<div class="choice">Is the candidate\'s answer correct? '
            f'<label><input class="cand" type="radio" name="label-{cid}" value="correct"> '
            f"correct</label>"
            f'<label><input class="cand" type="radio" name="label-{cid}" value="incorrect"> '
            f"incorrect</label>"
            f'<input class="note" type="text" placeholder="note (optional)"></div>'
            f"{_reference_html(r)}"
            "</div>"
        )
    data = {
        "sheet_id": sheet_id,
        "columns": columns,
        "rows": rows,
        "download": f"labels-{csv_name}",
    }
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{e(title)}</title><style>{SHEET_STYLE}</style></head><body>",
            "<header>",
            f"<h1>{e(title)}</h1>",
            f"<p>Sheet <code>{e(sheet_id)}</code>. Judge each candidate's final answer "
            "against the prompt (the reference may be wrong too: say so in the note). "
            "Choices stay in this browser; <b>Export CSV</b> writes the file to import with "
            f"<code>thresher audit import FILE</code>.</p>",
            '<p>Your name: <input id="who" type="text" placeholder="who labels"> '
            '<button id="export" type="button">Export CSV</button> '
            '<span id="progress"></span></p>',
            "</header>",
            *cards,
            f'<script id="sheet-data" type="application/json">{_json_for_script(data)}</script>',
            f"<script>{SHEET_SCRIPT}</script>",
            "</body></html>\n",
        ]
    )
