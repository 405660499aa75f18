"""Prompt datasets (local files or hub datasets) and the shipped arithmetic task."""
from openrlhf_hacpo.data.arithmetic import (
    LEVELS,
    Problem,
    Splits,
    TaskConfig,
    arithmetic_reward,
    export_jsonl,
    extract_answer,
    make_splits,
    response_text,
    sample_problems,
)
from openrlhf_hacpo.data.prompts import PromptDataLoader, PromptRecord, load_prompt_dataset

__all__ = [
    "LEVELS",
    "Problem",
    "PromptDataLoader",
    "PromptRecord",
    "Splits",
    "TaskConfig",
    "arithmetic_reward",
    "export_jsonl",
    "extract_answer",
    "load_prompt_dataset",
    "make_splits",
    "response_text",
    "sample_problems",
]
