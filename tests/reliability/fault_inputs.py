"""Reward files and a file writer shared by the fault-injection tests."""
from __future__ import annotations

from pathlib import Path

ZERO_REWARD = '''
def reward_func(queries, prompts, labels):
    return [0.0 for _ in queries]
'''
HANGING_REWARD = '''
import time

def reward_func(queries, prompts, labels):
    time.sleep(3600)
'''


def write_file(folder: Path, name: str, text: str) -> str:
    path = Path(folder) / name
    path.write_text(text)
    return str(path)
