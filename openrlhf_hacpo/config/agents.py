"""One agent's settings: :class:`AgentConfig`, the model and tokenizer of an agent and the settings it may set for
itself, each inheriting the run-wide value of :class:`~openrlhf_hacpo.config.sections.AgentDefaults` when left at
``None`` (:meth:`AgentConfig.resolved`, applied once by ``TrainConfig.validate``).

The inheritable settings and their rules are declared once, in :class:`AgentDefaults`: an agent's field of the same
name takes the same rules (:func:`_inherited`), and errors name it by its path (``agents[1] ('qwen').zero_stage must
be one of [0, 1, 2, 3], got 4``).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from openrlhf_hacpo.config.sections import AgentDefaults
from openrlhf_hacpo.utils.checks import fail
from openrlhf_hacpo.utils.options import check_fields

__all__ = ["AGENT_FIELDS", "INHERITED", "AgentConfig", "check_target_modules"]

INHERITED: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AgentDefaults))
"""The agent settings that inherit the run-wide value of the same name (the fields of :class:`AgentDefaults`)."""
_RULES = ("choices", "ge", "gt", "le", "lt", "also", "allow_inf")
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _inherited(name: str) -> Any:
    """An agent's setting ``name``: ``None`` (inherit :class:`AgentDefaults`'s value) or a value obeying the rules of
    the run-wide field (its choices and range; no flag: an agent's settings come from ``--agent`` or YAML)."""
    (run_wide,) = [f for f in dataclasses.fields(AgentDefaults) if f.name == name]
    return dataclasses.field(default=None, metadata={k: v for k, v in run_wide.metadata.items() if k in _RULES})


@dataclass
class AgentConfig:
    """One agent: its model, tokenizer and the settings that may differ between agents.

    * ``name``: used in logs, metrics and output folders (``hf/<name>/``); letters, digits, ``_.-``.
    * ``pretrain``: Hugging Face model folder or hub id of the policy (and of the reference model).
    * ``tokenizer``: tokenizer folder or id; defaults to ``pretrain``.
    * ``chat_template``: a Jinja template (text, or a path to a file holding it) replacing the tokenizer's own.
    * ``node``: pin the agent's bundles (GPUs; CPUs on a CPU-only run) to one node of a multi-node Ray cluster: its
      address (``10.0.0.2``), node id, a custom resource present on exactly that node (``nodeA``) or a ``key=value``
      label (docs/multinode.md).

    Left at ``None``, every other setting takes the run-wide value of :class:`AgentDefaults` (flag in brackets):

    * ``learning_rate`` (``--actor_learning_rate``), ``zero_stage``, ``bf16``, ``gradient_checkpointing``: optimizer
      and DeepSpeed settings.
    * ``dp_size`` (``--actor_num_gpus_per_node``): data-parallel policy workers (one GPU each on GPU machines, one
      process each on CPU).
    * ``vllm_num_engines`` / ``vllm_tensor_parallel_size``: this agent's vLLM rollout engines (``vllm`` backend).
    * ``attn_implementation``: passed to ``from_pretrained`` (``sdpa``, ``eager``, ``flash_attention_2``).
    * ``engine_dtype``: precision of the agent's rollout engines (``hf_engine``, ``vllm``): ``auto`` (the policy's),
      ``float32`` or ``bfloat16`` (:attr:`resolved_engine_dtype`).
    * ``lora_rank`` / ``lora_alpha`` / ``lora_dropout`` / ``target_modules``: a LoRA adapter instead of
      full-parameter training when ``lora_rank`` > 0 (:mod:`openrlhf_hacpo.actors.lora`).
    * ``adam_offload`` / ``param_offload`` / ``deepspeed_enable_sleep`` / ``ref_reward_offload``: where the policy's
      and the reference's states live (docs/gpu.md, Memory options).
    """

    name: str
    pretrain: str
    tokenizer: str | None = None
    chat_template: str | None = None
    learning_rate: float | None = _inherited("learning_rate")
    zero_stage: int | None = _inherited("zero_stage")
    bf16: bool | None = _inherited("bf16")
    gradient_checkpointing: bool | None = _inherited("gradient_checkpointing")
    dp_size: int | None = _inherited("dp_size")
    vllm_num_engines: int | None = _inherited("vllm_num_engines")
    vllm_tensor_parallel_size: int | None = _inherited("vllm_tensor_parallel_size")
    attn_implementation: str | None = _inherited("attn_implementation")
    engine_dtype: str | None = _inherited("engine_dtype")
    lora_rank: int | None = _inherited("lora_rank")
    lora_alpha: int | None = _inherited("lora_alpha")
    lora_dropout: float | None = _inherited("lora_dropout")
    target_modules: str | None = _inherited("target_modules")
    adam_offload: bool | None = _inherited("adam_offload")
    param_offload: bool | None = _inherited("param_offload")
    deepspeed_enable_sleep: bool | None = _inherited("deepspeed_enable_sleep")
    ref_reward_offload: bool | None = _inherited("ref_reward_offload")
    node: str | None = None

    def __post_init__(self) -> None:
        self.validate("AgentConfig")

    def validate(self, where: str = "AgentConfig") -> None:
        """Every field against its type and range (:func:`~openrlhf_hacpo.utils.options.check_fields`), then the
        name's spelling; ``where`` prefixes the field names in errors (``agents[1] ('qwen')``)."""
        check_fields(self, where)
        if not _AGENT_NAME.match(self.name):
            fail(f"{where}.name", "letters, digits, '_', '.', '-' (starting with a letter or digit)", self.name)
        if self.target_modules is not None:
            check_target_modules(f"{where}.target_modules", self.target_modules)

    def resolved(self, defaults: AgentDefaults) -> "AgentConfig":
        """This agent with every inherited setting left at ``None`` replaced by the run-wide value in ``defaults``."""
        return dataclasses.replace(self, **{name: getattr(defaults, name) for name in INHERITED
                                            if getattr(self, name) is None})

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.pretrain

    @property
    def policy_dtype(self) -> str:
        """The policy's weights' precision of a resolved agent: ``bfloat16`` with ``bf16``, else ``float32``."""
        return "bfloat16" if self.bf16 else "float32"

    @property
    def resolved_engine_dtype(self) -> str:
        """The engines' precision of a resolved agent (``TrainConfig.resolved_agents``): ``engine_dtype``, with
        ``auto`` (or unset) meaning the policy's (``bfloat16`` with ``bf16``, else ``float32``). The one place that
        decides it: the engine actors load their weights in it, the weight sync casts to it, the mismatch alarm's
        default reads it."""
        if self.engine_dtype in (None, "auto"):
            return self.policy_dtype
        return self.engine_dtype

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "agent") -> "AgentConfig":
        """Build from a mapping (a YAML entry or parsed ``--agent`` string); unknown keys raise ``ValueError``."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted((key for key in data if key not in known), key=str)  # YAML keys may be numbers
        if unknown:
            raise ValueError(f"{where}: unknown agent setting(s) {unknown}; known settings: {known}")
        name = data.get("name")
        if isinstance(name, str):
            where = f"{where} (agent {name!r})"
        for required in ("name", "pretrain"):
            if required not in data:
                raise ValueError(f"{where}: missing the required setting {required!r}")
        try:
            return cls(**dict(data))
        except ValueError as err:
            raise ValueError(f"{where}: {err}{_yaml_number_hint(data)}") from None


AGENT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AgentConfig))
if not set(INHERITED) <= set(AGENT_FIELDS):
    raise TypeError(f"AgentConfig lacks the inherited setting(s) {sorted(set(INHERITED) - set(AGENT_FIELDS))}")


def check_target_modules(where: str, value: str) -> None:
    """``target_modules``: ``all-linear`` or comma-separated module names, at least one."""
    if not any(name.strip() for name in value.split(",")):
        fail(where, "'all-linear' or comma-separated module names (at least one)", value)


def _yaml_number_hint(data: Mapping[str, Any]) -> str:
    """A hint when a numeric setting arrived as text (YAML reads ``1e-6`` without a dot as a string)."""
    for key in ("learning_rate",):
        value = data.get(key)
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                continue
            return f" (YAML read {key}: {value} as text; write it with a dot, e.g. 1.0e-6)"
    return ""
