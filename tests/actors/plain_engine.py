"""A plain engine with the part of DeepSpeed's engine surface the update loop uses, for tests without DeepSpeed."""
from __future__ import annotations

import torch


class PlainEngine:
    """The part of DeepSpeed's engine the update loop uses, over a plain module: gradients accumulate over
    ``gas`` micro-batches, then ``step`` applies the optimizer and clears them."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, gas: int) -> None:
        self.module, self.optimizer, self.gas, self.micro_steps = module, optimizer, gas, 0
        self.boundary: bool | None = None

    def __call__(self, **inputs):
        return self.module(**inputs)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
        loss.backward()

    def is_gradient_accumulation_boundary(self) -> bool:
        if self.boundary is not None:
            return self.boundary
        return (self.micro_steps + 1) % self.gas == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.boundary = is_boundary

    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.micro_steps += 1

    def get_global_grad_norm(self):
        return None

    def train(self):
        self.module.train()

    def eval(self):
        self.module.eval()


class Tok:
    pad_token_id = 0
    eos_token_id = 3
