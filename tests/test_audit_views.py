"""The audit views read the verdicts a selection's run read: under the options digest it
recorded, not whichever verdict of the verifier is newest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from thresher.stores.lake import SELECTION_VERDICTS_SQL
from thresher.stores.runs import record_run

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CANDIDATES = ["c0", "c1", "c2", "c3"]
LABELS = {"c0": "correct", "c1": "correct", "c2": "incorrect", "c3": "incorrect"}


def _curate_run(lake, run_id: str, started: datetime, digest: str | None) -> None:
    """A completed curate run of pipeline x, round 0, that wrote selection `run_id`."""
    summary = {"verifier_digests": {"majority": digest}} if digest else {"kept": 4}
    record_run(
        lake,
        run_id,
        flow="curate",
        round_=0,
        model="m",
        config={"name": "x", "verify": {"verifiers": ["majority"]}},
        status="completed",
        started_at=started,
        summary=summary,
        finished=True,
        selection_id=run_id,
    )


def _verdicts(lake, digest: str, passed: set[str], at: datetime) -> None:
    lake.append(
        "verdicts",
        [
            {"candidate_id": c, "verifier": "majority", "options_digest": digest,
             "score": float(c in passed), "passed": c in passed, "reason": digest,
             "created_at": at}
            for c in CANDIDATES
        ],
    )  # fmt: skip


def _quality(lake) -> dict:
    rows = lake.query(
        "SELECT * FROM verifier_quality WHERE pipeline = 'x' AND verifier = 'majority'"
    ).to_dicts()
    assert len(rows) == 1
    r = rows[0]
    return {k: r[k] for k in ("labelled", "true_pass", "false_pass", "true_fail", "false_fail")}


def _digests_read(lake) -> set[str]:
    """The digests of the verdicts the audit views read (each verdict's reason is its digest)."""
    rows = lake.query(f"WITH {SELECTION_VERDICTS_SQL} SELECT DISTINCT reason FROM sel_verdicts")
    return set(rows["reason"].to_list())


def test_quality_reads_the_verdicts_of_the_current_selections_run(lake):
    lake.append("candidates", [{"candidate_id": c, "prompt_id": "p", "round": 0}
                               for c in CANDIDATES])  # fmt: skip
    lake.append(
        "labels",
        [{"label_id": c, "candidate_id": c, "label": v, "who": "ana", "labelled_at": T0}
         for c, v in LABELS.items()],
    )  # fmt: skip
    for sid in ("k4", "k8"):
        lake.append(
            "selections",
            [{"selection_id": sid, "round": 0, "candidate_id": c, "prompt_id": "p",
              "kept": True, "run_id": sid, "created_at": T0} for c in CANDIDATES],
        )  # fmt: skip
    # k 4's verdicts are right about every candidate; k 8's (written later) about none
    _verdicts(lake, "d4", {"c0", "c1"}, T0)
    _verdicts(lake, "d8", {"c2", "c3"}, T0 + timedelta(hours=1))
    right = {"labelled": 4, "true_pass": 2, "false_pass": 0, "true_fail": 2, "false_fail": 0}
    wrong = {"labelled": 4, "true_pass": 0, "false_pass": 2, "true_fail": 0, "false_fail": 2}

    _curate_run(lake, "k4", T0, "d4")
    _curate_run(lake, "k8", T0 + timedelta(hours=1), "d8")
    assert _quality(lake) == wrong  # k 8's selection is current
    assert _digests_read(lake) == {"d8"}
    # the k 4 config run again: its selection is current, and so are its verdicts,
    # though k 8's are newer
    _curate_run(lake, "k4", T0 + timedelta(hours=2), "d4")
    assert _quality(lake) == right
    assert _digests_read(lake) == {"d4"}
    # a run that did not record its digests reads each verifier's newest verdict
    _curate_run(lake, "k4", T0 + timedelta(hours=3), None)
    assert _quality(lake) == wrong


def test_a_run_that_wrote_a_new_selection_leaves_no_orphan(lake):
    # the same curate run (same config) resumed after a verifier's version changed: it
    # records a new selection id; the one it wrote before is not "a selection outside
    # any run" (pipeline NULL), it is the pipeline's earlier one
    for sid, hours in (("old", 0), ("new", 1)):
        lake.append(
            "selections",
            [{"selection_id": sid, "round": 0, "candidate_id": c, "prompt_id": "p",
              "kept": True, "run_id": "r", "created_at": T0 + timedelta(hours=hours)}
             for c in CANDIDATES],
        )  # fmt: skip
        record_run(
            lake,
            "r",
            flow="curate",
            round_=0,
            model="m",
            config={"name": "x"},
            status="completed",
            started_at=T0 + timedelta(hours=hours),
            selection_id=sid,
        )
    current = lake.query("SELECT DISTINCT pipeline, selection_id FROM current_selections")
    assert current.rows() == [("x", "new")]
    assert lake.count("runs") == 1 and lake.count("run_updates") == 2
