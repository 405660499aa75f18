"""The paper's Tables 1, 2, 3 and 7 (HACPO v1) as data, for the comparison with reproduced values.

Each :class:`PaperRow` is one printed row: the table, the setting (the pair of agents trained together), the agent
(model), the method, the seven benchmark values (:data:`COLUMNS`, the order of the paper's columns) and the printed
AVG. Methods: ``base`` (the model before training), ``GRPO``, ``GSPO``, ``GSPOx2`` (GSPO with twice the rollouts),
``Naive`` (shared rollouts without HACPO's mechanisms), ``HACPO``, and the ablations ``HACPO-Adv`` (Table 2, without
the capability-aware advantage) and ``HACPO-omega`` (Table 3, without the discrepancy coefficient in the gradient).

The paper's metric is avg@1 (greedy, one sample) on every column but AIME25, which is verl's bootstrap best@30
(``openrlhf_hacpo.reproduce.metrics``). :attr:`PaperRow.avg` recomputes AVG as the unweighted mean of the seven
columns; :func:`avg_disagreements` lists the rows whose printed AVG differs from it by more than rounding.

Values are transcribed as printed (v1 of arXiv 2603.02604), including repeated rows: the single-agent baselines of
Qwen3-4B-Base appear in the size and model settings of Table 1 and again in Table 7, as the paper prints them.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLUMNS", "HUB_MODEL_IDS", "METHODS", "PAPER_ROWS", "PaperRow", "SETTINGS", "avg_disagreements",
           "paper_model_name", "paper_rows"]

COLUMNS: tuple[str, ...] = ("MATH-500", "MATH", "GSM8K", "AIME25", "AMC23", "Minerva", "Olympiad")
"""The paper's benchmark columns, in its order."""

COLUMN_SETS: dict[str, str] = {"MATH-500": "math500", "MATH": "math", "GSM8K": "gsm8k", "AIME25": "aime25",
                               "AMC23": "amc23", "Minerva": "minerva", "Olympiad": "olympiadbench"}
"""Paper column → the prepared set (``data_source``) that reproduces it."""

METHODS: tuple[str, ...] = ("base", "GRPO", "GSPO", "GSPOx2", "Naive", "HACPO", "HACPO-Adv", "HACPO-omega")

STATE = "qwen3-4b+qwen3-4b-instruct"
SIZE = "qwen3-1.7b-base+qwen3-4b-base"
MODEL = "qwen3-4b-base+llama3.2-3b-instruct"
QWEN_4B_8B = "qwen3-4b-base+qwen3-8b-base"
LLAMA_1B_3B = "llama3.2-1b-instruct+llama3.2-3b-instruct"
QWEN_LLAMA_1B = "qwen3-1.7b-base+llama3.2-1b-instruct"
SETTINGS: tuple[str, ...] = (STATE, SIZE, MODEL, QWEN_4B_8B, LLAMA_1B_3B, QWEN_LLAMA_1B)
"""Pairs of agents trained together, as ``<agent>+<agent>`` keys (the results JSON uses the same keys)."""

Q4, Q4I = "Qwen3-4B", "Qwen3-4B-Instruct"
Q17B, Q4B, Q8B = "Qwen3-1.7B-Base", "Qwen3-4B-Base", "Qwen3-8B-Base"
L1I, L3I = "Llama-3.2-1B-Instruct", "Llama-3.2-3B-Instruct"

HUB_MODEL_IDS: dict[str, str] = {
    Q17B: "Qwen/Qwen3-1.7B-Base",
    Q4B: "Qwen/Qwen3-4B-Base",
    Q8B: "Qwen/Qwen3-8B-Base",
    Q4: "Qwen/Qwen3-4B",
    Q4I: "Qwen/Qwen3-4B-Instruct-2507",
    L1I: "meta-llama/Llama-3.2-1B-Instruct",
    L3I: "meta-llama/Llama-3.2-3B-Instruct",
}
"""The paper names models only; these are the obvious hub ids. ``Qwen3-4B-Instruct`` as
``Qwen/Qwen3-4B-Instruct-2507`` is an assumption; the Llama models are gated."""


def paper_model_name(hub_id_or_path: str) -> str:
    """The paper's model name for a hub id (or a local folder named after one, such as ``.../Qwen3-4B-Base``)."""
    tail = hub_id_or_path.rstrip("/").split("/")[-1]
    for name, hub_id in HUB_MODEL_IDS.items():
        if hub_id_or_path == hub_id or tail == hub_id.split("/")[-1]:
            return name
    raise ValueError(f"{hub_id_or_path!r} is none of the paper's models ({', '.join(HUB_MODEL_IDS.values())})")


@dataclass(frozen=True)
class PaperRow:
    """One printed row of the paper's tables."""

    table: str
    setting: str
    model: str
    method: str
    values: tuple[float, ...]
    printed_avg: float

    def __post_init__(self) -> None:
        if len(self.values) != len(COLUMNS):
            raise ValueError(f"table {self.table} {self.model} {self.method}: {len(self.values)} values, "
                             f"expected {len(COLUMNS)}")
        if self.method not in METHODS:
            raise ValueError(f"table {self.table} {self.model}: unknown method {self.method!r}")

    @property
    def avg(self) -> float:
        """AVG recomputed: the unweighted mean of the seven columns."""
        return sum(self.values) / len(self.values)

    def value(self, column: str) -> float:
        return self.values[COLUMNS.index(column)]


def _row(table: str, setting: str, model: str, method: str, values: tuple[float, ...], avg: float) -> PaperRow:
    return PaperRow(table, setting, model, method, tuple(float(v) for v in values), float(avg))


#                                     MATH-500 MATH  GSM8K  AIME25 AMC23  Minerva Olympiad  printed AVG
PAPER_ROWS: tuple[PaperRow, ...] = (
    # Table 1, qwen3-4b+qwen3-4b-instruct
    _row("1", STATE, Q4, "base", (0.802, 0.836, 0.907, 0.335, 0.65, 0.39, 0.524), 0.635),
    _row("1", STATE, Q4, "GRPO", (0.88, 0.889, 0.918, 0.582, 0.775, 0.386, 0.592), 0.717),
    _row("1", STATE, Q4, "GSPO", (0.854, 0.87, 0.925, 0.485, 0.675, 0.412, 0.564), 0.684),
    _row("1", STATE, Q4, "GSPOx2", (0.876, 0.875, 0.923, 0.522, 0.675, 0.39, 0.579), 0.691),
    _row("1", STATE, Q4, "Naive", (0.728, 0.737, 0.891, 0.378, 0.6, 0.353, 0.394), 0.583),
    _row("1", STATE, Q4, "HACPO", (0.91, 0.905, 0.933, 0.622, 0.85, 0.423, 0.643), 0.755),
    _row("1", STATE, Q4I, "base", (0.938, 0.937, 0.936, 0.696, 0.85, 0.441, 0.722), 0.789),
    _row("1", STATE, Q4I, "GRPO", (0.93, 0.933, 0.933, 0.676, 0.875, 0.43, 0.72), 0.785),
    _row("1", STATE, Q4I, "GSPO", (0.938, 0.94, 0.939, 0.72, 0.9, 0.43, 0.726), 0.799),
    _row("1", STATE, Q4I, "GSPOx2", (0.932, 0.939, 0.942, 0.74, 0.9, 0.43, 0.711), 0.799),
    _row("1", STATE, Q4I, "Naive", (0.844, 0.845, 0.936, 0.547, 0.725, 0.39, 0.552), 0.691),
    _row("1", STATE, Q4I, "HACPO", (0.948, 0.943, 0.946, 0.757, 0.95, 0.452, 0.732), 0.813),
    # Table 1, qwen3-1.7b-base+qwen3-4b-base
    _row("1", SIZE, Q17B, "base", (0.5, 0.483, 0.616, 0.033, 0.3, 0.206, 0.229), 0.338),
    _row("1", SIZE, Q17B, "GRPO", (0.682, 0.652, 0.824, 0.16, 0.375, 0.272, 0.298), 0.466),
    _row("1", SIZE, Q17B, "GSPO", (0.648, 0.641, 0.826, 0.148, 0.45, 0.272, 0.287), 0.467),
    _row("1", SIZE, Q17B, "GSPOx2", (0.664, 0.65, 0.829, 0.177, 0.375, 0.265, 0.293), 0.475),
    _row("1", SIZE, Q17B, "Naive", (0.608, 0.601, 0.798, 0.147, 0.325, 0.235, 0.263), 0.425),
    _row("1", SIZE, Q17B, "HACPO", (0.69, 0.674, 0.822, 0.225, 0.45, 0.279, 0.314), 0.493),
    _row("1", SIZE, Q4B, "base", (0.61, 0.676, 0.445, 0.1, 0.4, 0.308, 0.347), 0.412),
    _row("1", SIZE, Q4B, "GRPO", (0.796, 0.788, 0.885, 0.307, 0.475, 0.349, 0.454), 0.579),
    _row("1", SIZE, Q4B, "GSPO", (0.782, 0.787, 0.877, 0.25, 0.525, 0.368, 0.46), 0.578),
    _row("1", SIZE, Q4B, "GSPOx2", (0.756, 0.794, 0.873, 0.208, 0.55, 0.382, 0.463), 0.575),
    _row("1", SIZE, Q4B, "Naive", (0.708, 0.712, 0.895, 0.196, 0.475, 0.342, 0.354), 0.526),
    _row("1", SIZE, Q4B, "HACPO", (0.808, 0.801, 0.903, 0.267, 0.575, 0.386, 0.467), 0.601),
    # Table 1, qwen3-4b-base+llama3.2-3b-instruct
    _row("1", MODEL, Q4B, "base", (0.61, 0.676, 0.445, 0.1, 0.4, 0.308, 0.347), 0.412),
    _row("1", MODEL, Q4B, "GRPO", (0.796, 0.788, 0.885, 0.307, 0.475, 0.349, 0.454), 0.579),
    _row("1", MODEL, Q4B, "GSPO", (0.782, 0.787, 0.877, 0.25, 0.525, 0.368, 0.46), 0.578),
    _row("1", MODEL, Q4B, "GSPOx2", (0.756, 0.794, 0.873, 0.208, 0.55, 0.382, 0.463), 0.575),
    _row("1", MODEL, Q4B, "Naive", (0.734, 0.712, 0.895, 0.143, 0.55, 0.342, 0.354), 0.526),
    _row("1", MODEL, Q4B, "HACPO", (0.786, 0.783, 0.921, 0.268, 0.6, 0.379, 0.442), 0.597),
    _row("1", MODEL, L3I, "base", (0.267, 0.441, 0.788, 0.0, 0.2, 0.169, 0.158), 0.289),
    _row("1", MODEL, L3I, "GRPO", (0.502, 0.507, 0.814, 0.0, 0.25, 0.199, 0.174), 0.349),
    _row("1", MODEL, L3I, "GSPO", (0.512, 0.501, 0.812, 0.054, 0.225, 0.184, 0.17), 0.351),
    _row("1", MODEL, L3I, "GSPOx2", (0.488, 0.498, 0.829, 0.0, 0.175, 0.188, 0.159), 0.334),
    _row("1", MODEL, L3I, "Naive", (0.406, 0.407, 0.734, 0.0, 0.225, 0.177, 0.107), 0.294),
    _row("1", MODEL, L3I, "HACPO", (0.566, 0.548, 0.826, 0.054, 0.35, 0.176, 0.208), 0.39),
    # Table 2, qwen3-1.7b-base+qwen3-4b-base
    _row("2", SIZE, Q17B, "HACPO-Adv", (0.696, 0.659, 0.825, 0.126, 0.375, 0.261, 0.313), 0.465),
    _row("2", SIZE, Q17B, "HACPO", (0.69, 0.674, 0.822, 0.225, 0.45, 0.279, 0.314), 0.493),
    _row("2", SIZE, Q4B, "HACPO-Adv", (0.774, 0.771, 0.912, 0.308, 0.55, 0.348, 0.442), 0.586),
    _row("2", SIZE, Q4B, "HACPO", (0.808, 0.801, 0.903, 0.267, 0.575, 0.386, 0.467), 0.601),
    # Table 3, qwen3-1.7b-base+qwen3-4b-base
    _row("3", SIZE, Q17B, "HACPO-omega", (0.666, 0.657, 0.806, 0.105, 0.425, 0.25, 0.324), 0.462),
    _row("3", SIZE, Q17B, "HACPO", (0.69, 0.674, 0.822, 0.225, 0.45, 0.279, 0.314), 0.493),
    _row("3", SIZE, Q4B, "HACPO-omega", (0.816, 0.797, 0.902, 0.261, 0.55, 0.401, 0.475), 0.6),
    _row("3", SIZE, Q4B, "HACPO", (0.808, 0.801, 0.903, 0.267, 0.575, 0.386, 0.467), 0.601),
    # Table 7, qwen3-4b-base+qwen3-8b-base
    _row("7", QWEN_4B_8B, Q4B, "base", (0.61, 0.676, 0.445, 0.1, 0.4, 0.308, 0.347), 0.412),
    _row("7", QWEN_4B_8B, Q4B, "GRPO", (0.796, 0.788, 0.885, 0.307, 0.475, 0.349, 0.454), 0.579),
    _row("7", QWEN_4B_8B, Q4B, "GSPO", (0.782, 0.787, 0.877, 0.25, 0.525, 0.368, 0.46), 0.578),
    _row("7", QWEN_4B_8B, Q4B, "GSPOx2", (0.756, 0.794, 0.873, 0.208, 0.55, 0.382, 0.463), 0.575),
    _row("7", QWEN_4B_8B, Q4B, "Naive", (0.734, 0.712, 0.895, 0.143, 0.55, 0.342, 0.354), 0.526),
    _row("7", QWEN_4B_8B, Q4B, "HACPO", (0.81, 0.803, 0.904, 0.275, 0.6, 0.364, 0.463), 0.614),
    _row("7", QWEN_4B_8B, Q8B, "base", (0.647, 0.713, 0.684, 0.033, 0.4, 0.232, 0.375), 0.441),
    _row("7", QWEN_4B_8B, Q8B, "GRPO", (0.814, 0.812, 0.921, 0.265, 0.575, 0.415, 0.479), 0.612),
    _row("7", QWEN_4B_8B, Q8B, "GSPO", (0.794, 0.804, 0.923, 0.225, 0.6, 0.426, 0.468), 0.606),
    _row("7", QWEN_4B_8B, Q8B, "GSPOx2", (0.8, 0.803, 0.92, 0.2, 0.575, 0.404, 0.46), 0.595),
    _row("7", QWEN_4B_8B, Q8B, "Naive", (0.79, 0.783, 0.921, 0.252, 0.5, 0.408, 0.429), 0.583),
    _row("7", QWEN_4B_8B, Q8B, "HACPO", (0.828, 0.813, 0.933, 0.323, 0.625, 0.423, 0.467), 0.63),
    # Table 7, llama3.2-1b-instruct+llama3.2-3b-instruct
    _row("7", LLAMA_1B_3B, L1I, "base", (0.176, 0.297, 0.489, 0, 0.15, 0.052, 0.061), 0.18),
    _row("7", LLAMA_1B_3B, L1I, "GRPO", (0.35, 0.349, 0.569, 0, 0.125, 0.008, 0.097), 0.214),
    _row("7", LLAMA_1B_3B, L1I, "GSPO", (0.356, 0.346, 0.523, 0.021, 0.125, 0.066, 0.088), 0.218),
    _row("7", LLAMA_1B_3B, L1I, "GSPOx2", (0.352, 0.349, 0.573, 0.07, 0.125, 0.079, 0.103), 0.227),
    _row("7", LLAMA_1B_3B, L1I, "Naive", (0.284, 0.302, 0.45, 0.0, 0.025, 0.066, 0.073), 0.171),
    _row("7", LLAMA_1B_3B, L1I, "HACPO", (0.35, 0.352, 0.541, 0.022, 0.2, 0.081, 0.085), 0.233),
    _row("7", LLAMA_1B_3B, L3I, "base", (0.267, 0.441, 0.788, 0.0, 0.2, 0.169, 0.158), 0.289),
    _row("7", LLAMA_1B_3B, L3I, "GRPO", (0.502, 0.507, 0.814, 0.0, 0.25, 0.199, 0.174), 0.349),
    _row("7", LLAMA_1B_3B, L3I, "GSPO", (0.512, 0.501, 0.812, 0.054, 0.225, 0.184, 0.17), 0.351),
    _row("7", LLAMA_1B_3B, L3I, "GSPOx2", (0.488, 0.498, 0.829, 0.0, 0.175, 0.188, 0.159), 0.334),
    _row("7", LLAMA_1B_3B, L3I, "Naive", (0.406, 0.407, 0.734, 0.0, 0.225, 0.177, 0.107), 0.294),
    _row("7", LLAMA_1B_3B, L3I, "HACPO", (0.522, 0.51, 0.828, 0.067, 0.275, 0.199, 0.188), 0.37),
    # Table 7, qwen3-1.7b-base+llama3.2-1b-instruct
    _row("7", QWEN_LLAMA_1B, Q17B, "base", (0.5, 0.483, 0.616, 0.033, 0.3, 0.206, 0.229), 0.338),
    _row("7", QWEN_LLAMA_1B, Q17B, "GRPO", (0.682, 0.652, 0.824, 0.16, 0.375, 0.272, 0.298), 0.466),
    _row("7", QWEN_LLAMA_1B, Q17B, "GSPO", (0.648, 0.641, 0.826, 0.148, 0.45, 0.272, 0.287), 0.467),
    _row("7", QWEN_LLAMA_1B, Q17B, "GSPOx2", (0.664, 0.65, 0.829, 0.177, 0.375, 0.265, 0.293), 0.475),
    _row("7", QWEN_LLAMA_1B, Q17B, "Naive", (0.59, 0.596, 0.798, 0.105, 0.3, 0.221, 0.241), 0.407),
    _row("7", QWEN_LLAMA_1B, Q17B, "HACPO", (0.676, 0.661, 0.838, 0.22, 0.45, 0.305, 0.32), 0.496),
    _row("7", QWEN_LLAMA_1B, L1I, "base", (0.176, 0.297, 0.489, 0.033, 0.15, 0.052, 0.061), 0.18),
    _row("7", QWEN_LLAMA_1B, L1I, "GRPO", (0.35, 0.349, 0.569, 0, 0.125, 0.008, 0.097), 0.214),
    _row("7", QWEN_LLAMA_1B, L1I, "GSPO", (0.356, 0.346, 0.523, 0.021, 0.125, 0.066, 0.088), 0.218),
    _row("7", QWEN_LLAMA_1B, L1I, "GSPOx2", (0.352, 0.349, 0.573, 0.07, 0.125, 0.079, 0.103), 0.227),
    _row("7", QWEN_LLAMA_1B, L1I, "Naive", (0.336, 0.337, 0.512, 0.0, 0.125, 0.066, 0.071), 0.214),
    _row("7", QWEN_LLAMA_1B, L1I, "HACPO", (0.356, 0.368, 0.533, 0.033, 0.15, 0.066, 0.091), 0.228),
)


def paper_rows(table: str | None = None, setting: str | None = None) -> list[PaperRow]:
    """The rows of one table and/or one setting, in printed order."""
    return [r for r in PAPER_ROWS if (table is None or r.table == table) and (setting is None or r.setting == setting)]


def avg_disagreements(tolerance: float = 0.0015) -> list[tuple[PaperRow, float]]:
    """Rows whose printed AVG differs from the recomputed mean by more than ``tolerance`` (printed values carry
    three decimals, so their mean can differ from a mean of unrounded values by up to 0.0005 + the AVG's own
    rounding), with the difference printed − recomputed."""
    return [(r, r.printed_avg - r.avg) for r in PAPER_ROWS if abs(r.printed_avg - r.avg) > tolerance]
