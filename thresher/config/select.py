"""The select section: what of the verified candidates becomes training data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from thresher.config.base import _Strict, never


class SemanticConfig(_Strict):
    """Reworded evaluation items: a training prompt whose embedding is near an evaluation
    item's, where the two also agree on what decides the answer."""

    model: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        description="a sentence-transformers model: a Hub name or a local folder",
    )
    min_similarity: float = Field(
        0.6,
        gt=0,
        le=1,
        description="cosine similarity from which a pair is compared at all; below it, "
        "nothing counts as contamination",
    )
    same_answer_similarity: float = Field(
        0.9,
        gt=0,
        le=1,
        description="cosine from which a pair whose texts hold no numbers or quoted names "
        "counts when the two references agree",
    )
    neighbours: int = Field(20, ge=1, description="nearest evaluation items compared per prompt")
    batch_size: int = never(default=64, ge=1, description="texts embedded per batch")


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
    semantic: SemanticConfig | None = Field(
        None,
        description="also drop reworded evaluation items: close in meaning (sentence "
        "embeddings) and the evidence agrees (the same numbers, quoted names or answer)",
    )


class SuspectConfig(_Strict):
    """A suspect reference: a prompt's own samples (every round's, every model's, unhinted)
    from models reliable elsewhere agree on one answer that is not its reference, and
    rarely give the reference."""

    enabled: bool = True
    min_samples: int = Field(8, ge=2, description="samples with a final answer, at least")
    min_share: float = Field(
        0.6, gt=0.5, le=1, description="share of those samples that give the agreed answer"
    )
    max_reference_share: float = Field(
        0.1, ge=0, lt=1, description="share that gives the reference, at most"
    )
    min_model_agreement: float = Field(
        0.9,
        ge=0,
        le=1,
        description="a model's samples count only when, on the other prompts where they "
        "agreed (min_share of its own answers), the agreed answer was the reference this "
        "often: a weak model's agreement is a habit, not evidence",
    )
    min_model_prompts: int = Field(
        20, ge=1, description="... measured on at least this many prompts"
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
    suspects: SuspectConfig = Field(
        default_factory=SuspectConfig,
        description="keep prompts whose samples agree on another answer than the "
        "reference out of training (`suspect_reference`)",
    )
    min_test_strength: float | None = Field(
        None,
        ge=0,
        le=1,
        description="drop candidates of code prompts whose tests kill fewer than this share "
        "of the reference's mutants (`thresher tests-audit`; a prompt never audited is "
        "dropped too), as `weak_tests`",
    )
