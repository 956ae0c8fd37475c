"""The select section: what of the verified candidates becomes training data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from thresher.config.base import _Strict


class DecontamConfig(_Strict):
    """Keep evaluation items out of training data."""

    counted_at_default = frozenset(
        {"enabled", "eval_datasets", "files", "ngram", "minhash_threshold"}
    )

    enabled: bool = True
    eval_datasets: list[str] | None = Field(
        None, description="datasets whose eval split is checked (default: every dataset)"
    )
    files: list[str] = Field(default_factory=list, description="more JSONL/text files to check")
    ngram: int = Field(13, ge=1, description="word n-gram overlap that counts as contamination")
    exact: bool = Field(
        False,
        description="only a whole text equal to an eval item (case and spacing aside) counts: "
        "for templated tasks, whose different questions share long n-grams",
    )
    minhash_threshold: float | None = Field(
        None, gt=0, lt=1, description="also drop near matches at this estimated Jaccard"
    )


class SelectConfig(_Strict):
    """What survives: failures, easy prompts, contamination and duplicates are dropped,
    then at most `cap` candidates per prompt are kept, chosen by `policy`."""

    counted_at_default = frozenset(
        {
            "cap",
            "keep_truncated",
            "policy",
            "seed",
            "lowercase",
            "near_dup",
            "threshold",
            "num_perm",
            "shingle_size",
            "across_prompts",
            "max_pass_rate",
            "decontaminate",
        }
    )

    cap: int = Field(4, ge=1, description="most candidates kept per prompt")
    keep_truncated: bool = Field(
        False,
        description="keep passing candidates cut at max_tokens (by default dropped as "
        "`truncated`: trained with an end-of-sequence token, they teach the model to stop "
        "mid-thought)",
    )
    policy: Literal["diverse", "shortest", "top_score", "random", "first"] = Field(
        "diverse", description="which candidates the cap keeps"
    )
    seed: int = Field(0, description="seed of the random policy")
    lowercase: bool = Field(False, description="case-insensitive duplicate detection")
    near_dup: bool = Field(True, description="MinHash LSH near-duplicate removal")
    threshold: float = Field(0.8, gt=0, lt=1, description="near-duplicate Jaccard threshold")
    num_perm: int = Field(128, ge=16)
    shingle_size: int = Field(5, ge=1, description="words per shingle")
    across_prompts: bool = Field(False, description="near-duplicates across prompts too")
    max_pass_rate: float | None = Field(
        None, ge=0, le=1, description="drop prompts solved more often than this (too easy)"
    )
    decontaminate: DecontamConfig = Field(default_factory=DecontamConfig)
    answer_balance: float | None = Field(
        None,
        ge=0,
        le=1,
        description="within each task, the kept share of one final answer stays within this "
        "margin of that answer's share among the round's references; the excess is dropped "
        "as `answer_share` (a loop that keeps more '1's than the references hold learns a "
        "prior, not a skill)",
    )
    teacher_cap: int = Field(
        1, ge=0, description="most teacher candidates kept per prompt (the `teacher_share` drop)"
    )
    max_teacher_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="most teacher candidates among those kept (per batch), as `teacher_share`",
    )
    max_hint_copy: float = Field(
        0.8,
        gt=0,
        le=1,
        description="a candidate sampled with part of a solution as its hint is dropped "
        "(`copies_hint`) when more than this share of its words lie in word 3-grams of the "
        "hint",
    )
    min_test_strength: float | None = Field(
        None,
        ge=0,
        le=1,
        description="drop candidates of code prompts whose tests kill fewer than this share "
        "of the reference's mutants (`thresher tests-audit`; a prompt never audited is "
        "dropped too), as `weak_tests`",
    )
