"""A ZeRO-3 policy's weights read back over two gloo ranks (CPU) are the checkpoint's, exactly, and every blocking
gather waits on each parameter.

DeepSpeed's blocking gather of several parameters (``GatheredParameters``: weight export, ``save_hf``, LoRA merges)
launches one asynchronous all-gather per parameter and waits on the last handle only; gloo runs a group's ops on
several threads, so an earlier gather may still be writing when the weights are read (a two-rank run read a
layer-norm weight back with elements of 1.7e5). ``build_ds_config`` turns on DeepSpeed's sequential gathers on gloo.
The race needs a loaded machine to show, so besides the exact read-back the test counts the calls of DeepSpeed's
coalesced blocking gather in each rank: none may happen.
"""
from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.utils.network import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def read_weights(cfg, rank: int, port: int, out: str) -> None:
    """One rank: build the agent's ZeRO-3 policy, read its full weights, save them (rank 0) and the number of
    coalesced blocking gathers this rank ran."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from deepspeed.runtime.zero.partition_parameters import Init

    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker

    calls = []
    coalesced = Init._allgather_params_coalesced

    def counted(self, *args, **kwargs):
        calls.append(len(args[0]))
        return coalesced(self, *args, **kwargs)

    Init._allgather_params_coalesced = counted
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0], rank, 2, "127.0.0.1", port)
    worker.setup()
    weights = worker.state_dict_for_sync()
    torch.save({"calls": calls, "weights": weights if rank == 0 else None}, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def test_two_gloo_ranks_read_back_the_checkpoint_weights(tmp_path, tiny_agents, base_args):
    from transformers import AutoModelForCausalLM

    cfg = build_config(base_args(tmp_path, "--agent", f"name=llama,pretrain={tiny_agents['llama']},dp_size=2,"
                                 "zero_stage=3", "--algorithm", "gspo", "--train_batch_size", "8", "--no_save_hf"))
    out = str(tmp_path / "read")
    port = free_port("127.0.0.1")
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=read_weights, args=(cfg, rank, port, out)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
    assert [p.exitcode for p in ranks] == [0, 0], "a rank failed: see its output above"
    results = [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]
    assert [r["calls"] for r in results] == [[], []], "DeepSpeed's coalesced blocking gather ran on gloo"

    expected = AutoModelForCausalLM.from_pretrained(tiny_agents["llama"], dtype=torch.float32).state_dict()
    weights = results[0]["weights"]
    assert set(weights) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
