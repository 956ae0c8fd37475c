"""Explicit Arrow schemas of the lake's tables."""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

# What a prompt row says of itself (what ingest reads and verifiers judge by); the rest of
# the `prompts` table (ids, dataset, split, source) is thresher's own bookkeeping.
PROMPT_FIELDS = ("prompt", "messages", "task", "answer", "tests", "meta")

# Who labelled, in which note, from which sheet and file, and when (labels and
# reference_labels alike).
LABELLED_BY = [
    ("who", pa.string()),
    ("note", pa.string()),
    ("sheet_id", pa.string()),  # the audit sheet the label came from, if any
    ("source", pa.string()),  # the imported file
    ("line", pa.int64()),
    ("labelled_at", TS),
    ("imported_at", TS),
]

SCHEMAS: dict[str, pa.Schema] = {
    "prompts": pa.schema(
        [
            ("prompt_id", pa.string()),
            ("dataset", pa.string()),
            ("split", pa.string()),
            ("task", pa.string()),
            ("prompt", pa.string()),
            ("messages", pa.string()),  # JSON list of {role, content}, or null
            ("answer", pa.string()),
            ("tests", pa.string()),
            ("meta", pa.string()),  # JSON object
            ("source", pa.string()),
            ("line", pa.int64()),
            ("ingested_at", TS),
        ]
    ),
    "rejects": pa.schema(
        [
            ("reject_id", pa.string()),
            ("source", pa.string()),
            ("line", pa.int64()),
            ("dataset", pa.string()),
            ("raw", pa.string()),
            ("reason", pa.string()),
            ("rejected_at", TS),
        ]
    ),
    "runs": pa.schema(
        [
            ("run_id", pa.string()),
            ("flow", pa.string()),
            ("round", pa.int64()),
            ("model", pa.string()),
            ("config", pa.string()),  # JSON
            ("selection_id", pa.string()),  # curate: the selection it wrote and reads
            ("read_versions", pa.string()),  # JSON {table: version}: the snapshot it read
            ("status", pa.string()),
            ("summary", pa.string()),  # JSON
            ("started_at", TS),
            ("finished_at", TS),
            ("updated_at", TS),
        ]
    ),
    "candidates": pa.schema(
        [
            ("candidate_id", pa.string()),
            ("prompt_id", pa.string()),
            ("run_id", pa.string()),
            ("round", pa.int64()),
            ("model", pa.string()),
            ("sample_idx", pa.int64()),
            ("text", pa.string()),
            ("n_tokens", pa.int64()),
            ("finish_reason", pa.string()),
            ("hinted", pa.bool_()),  # not the student's own unaided sample (a hint, a teacher)
            ("batch_id", pa.string()),
            ("created_at", TS),
            # with a tool: JSON list of the model's text, its code and the tool's outputs
            ("segments", pa.string()),
            # who made it: student, hint:answer, hint:solution, teacher:<name> (NULL: a lake
            # written before sources, see SOURCE_SQL) and the hint it was given
            ("source", pa.string()),
            ("hint", pa.string()),
        ]
    ),
    "verdicts": pa.schema(
        [
            ("candidate_id", pa.string()),
            ("verifier", pa.string()),
            ("options_digest", pa.string()),  # the verifier's version and options
            ("score", pa.float64()),
            ("passed", pa.bool_()),
            ("reason", pa.string()),
            ("elapsed_ms", pa.float64()),
            ("run_id", pa.string()),
            ("created_at", TS),
            # the final answer an answer-reading verifier found (null: none, or not one)
            ("answer", pa.string()),
        ]
    ),
    "selections": pa.schema(
        [
            ("selection_id", pa.string()),  # a digest of everything selection depends on
            ("round", pa.int64()),
            ("candidate_id", pa.string()),
            ("prompt_id", pa.string()),
            ("kept", pa.bool_()),
            ("drop_reason", pa.string()),
            ("run_id", pa.string()),
            ("created_at", TS),
        ]
    ),
    "train_metrics": pa.schema(
        [
            ("run_id", pa.string()),
            ("step", pa.int64()),
            ("epoch", pa.float64()),
            ("loss", pa.float64()),
            ("eval_loss", pa.float64()),
            ("lr", pa.float64()),
            ("tokens", pa.int64()),
            ("tokens_per_s", pa.float64()),
            ("created_at", TS),
        ]
    ),
    "evals": pa.schema(
        [
            ("round", pa.int64()),
            ("model", pa.string()),
            ("split", pa.string()),
            ("task", pa.string()),  # a task name, or "all"
            ("metric", pa.string()),  # pass@k
            ("value", pa.float64()),
            ("prompts", pa.int64()),
            ("samples", pa.int64()),  # samples per prompt (n)
            ("run_id", pa.string()),
            ("created_at", TS),
        ]
    ),
    # Human judgements of candidates (`thresher audit import`): the truth verifiers are
    # measured against. A candidate's label is its latest one.
    "labels": pa.schema(
        [
            ("label_id", pa.string()),  # digest of candidate, who, label and note
            ("candidate_id", pa.string()),
            ("label", pa.string()),  # correct | incorrect
            *LABELLED_BY,
        ]
    ),
    # Each curated round's monitors (evaluators.monitors): one row per selection and
    # metric; the headroom also names the evaluation it was read from.
    "monitors": pa.schema(
        [
            ("selection_id", pa.string()),
            ("pipeline", pa.string()),
            ("round", pa.int64()),
            ("metric", pa.string()),
            ("value", pa.float64()),
            ("detail", pa.string()),  # e.g. the repeated sentence, or "pass@8" of headroom
            ("eval_run_id", pa.string()),  # headroom: the evaluation read (else NULL)
            ("run_id", pa.string()),
            ("created_at", TS),
        ]
    ),
    # Each prompt's test strength (verifiers.strength, `thresher tests-audit`): one row per
    # audit and suite (the original tests, and the strengthened ones, kept here as the
    # prompt's new version of its tests).
    "test_strength": pa.schema(
        [
            ("audit_id", pa.string()),  # digest of prompt, tests, reference and settings
            ("prompt_id", pa.string()),
            ("dataset", pa.string()),
            ("suite", pa.string()),  # original | strengthened
            ("tests_id", pa.string()),
            ("tests", pa.string()),  # as prompts store them
            ("reference_passes", pa.bool_()),
            ("mutants", pa.int64()),
            ("killed", pa.int64()),
            ("equivalent", pa.int64()),  # surviving mutants with the reference's answers
            ("kill_rate", pa.float64()),  # killed / (mutants - equivalent)
            ("survivors", pa.string()),  # JSON [{kind, equivalent}]
            ("generated", pa.int64()),  # strengthened: new inputs made
            ("kept", pa.int64()),  # ... that became tests
            ("dropped", pa.string()),  # JSON {why: count}
            ("note", pa.string()),
            ("settings", pa.string()),  # JSON {mutants, inputs, version}
            ("run_id", pa.string()),
            ("created_at", TS),
        ]
    ),
    # Sentence embeddings of texts (thresher.embeddings): computed once per text and model,
    # reused by every later round and run.
    "embeddings": pa.schema(
        [
            ("text_id", pa.string()),  # digest of the text
            ("model", pa.string()),
            ("vector", pa.list_(pa.float32())),  # unit length
            ("created_at", TS),
        ]
    ),
    # What a selection's flags rest on (selection.select): one row per selection, prompt,
    # kind and evaluation item.
    "evidence": pa.schema(
        [
            ("selection_id", pa.string()),
            ("round", pa.int64()),
            ("prompt_id", pa.string()),
            ("kind", pa.string()),  # reworded | suspect_reference
            ("eval_prompt_id", pa.string()),  # reworded: the evaluation item it matches
            ("similarity", pa.float64()),  # reworded: cosine similarity of the two prompts
            ("agreed", pa.string()),  # reworded: what agreed; suspect: the agreed answer
            ("share", pa.float64()),  # suspect: share of the samples giving that answer
            ("reference_share", pa.float64()),  # suspect: share giving the reference
            ("samples", pa.int64()),  # suspect: samples with a final answer
            ("models", pa.string()),  # suspect: JSON {model: samples}
            ("reference", pa.string()),  # the reference the flag judged
            ("run_id", pa.string()),
            ("created_at", TS),
        ]
    ),
    # A person's verdict on a prompt's reference answer (`thresher audit import`): right,
    # or wrong with the right answer. The prompt keeps its reference; its latest label
    # counts, and verdicts made after a `wrong` label judge by the label's answer.
    "reference_labels": pa.schema(
        [
            ("label_id", pa.string()),  # digest of prompt, label, answer, who and note
            ("prompt_id", pa.string()),
            ("label", pa.string()),  # right | wrong
            ("answer", pa.string()),  # wrong: the right answer
            ("reference", pa.string()),  # the reference it judged
            *LABELLED_BY,
        ]
    ),
}

# Columns that identify a row: appending a row whose key is already present adds nothing.
# Each stage's rows are identified by exactly what determines them, so a changed setting
# adds new rows for that stage and reuses the rest; `run_id` columns only record which
# run wrote a row.
KEYS: dict[str, tuple[str, ...]] = {
    "prompts": ("prompt_id",),
    "rejects": ("reject_id",),
    "runs": (),  # status updates are appended; the view shows the latest row per run
    "candidates": ("candidate_id",),
    "verdicts": ("candidate_id", "verifier", "options_digest"),
    "selections": ("selection_id", "candidate_id"),
    "train_metrics": ("run_id", "step"),
    "evals": ("run_id", "task", "metric"),
    "labels": ("label_id",),
    "monitors": ("selection_id", "metric", "eval_run_id"),
    "test_strength": ("audit_id", "suite"),
    "embeddings": ("text_id", "model"),
    "evidence": ("selection_id", "prompt_id", "kind", "eval_prompt_id"),
    "reference_labels": ("label_id",),
}

TABLES = tuple(SCHEMAS)


class DropReason(StrEnum):
    """Why selection dropped a candidate (`selections.drop_reason`; NULL: kept)."""

    failed = "failed"  # the verify rule does not hold
    truncated = "truncated"  # it passed, but was cut at max_tokens (keep_truncated: false)
    too_easy = "too_easy"  # its prompt's pass rate is above max_pass_rate
    contaminated = "contaminated"  # contaminated:<eval item>
    duplicate_of = "duplicate_of"  # duplicate_of:<the kept candidate's id>
    capped = "capped"  # over the per-prompt cap
    hint_share = "hint_share"  # a hinted candidate over the share of hinted data
    copies_hint = "copies_hint"  # it mostly restates the solution its hint gave
    teacher_share = "teacher_share"  # a teacher's, over the per-prompt cap or the share
    weak_tests = "weak_tests"  # weak_tests:<kill rate or 'not audited'> (min_test_strength)
    answer_share = "answer_share"  # answer_share:<answer>: over its reference share
    suspect_reference = "suspect_reference"  # suspect_reference:<the answer samples agree on>

    def of(self, detail: str) -> str:
        """The stored reason with its detail: `contaminated:eval-1`."""
        return f"{self.value}:{detail}"

    def sql(self) -> str:
        """A SQL condition on `drop_reason` that holds for this reason."""
        if self in (
            DropReason.contaminated,
            DropReason.duplicate_of,
            DropReason.weak_tests,
            DropReason.answer_share,
            DropReason.suspect_reference,
        ):
            return f"drop_reason LIKE '{self.value}:%'"
        return f"drop_reason = '{self.value}'"


# A candidate passed when the rule held: it was not dropped as `failed`.
PASSED_SQL = f"drop_reason IS DISTINCT FROM '{DropReason.failed.value}'"

# Who made a candidate `c` (rows written before sources: the student, or an answer hint).
SOURCE_SQL = (
    "coalesce(c.source, CASE WHEN coalesce(c.hinted, false) THEN 'hint:answer' ELSE 'student' END)"
)
STUDENT, ANSWER_HINT, SOLUTION_HINT, TEACHER = "student", "hint:answer", "hint:solution", "teacher:"
