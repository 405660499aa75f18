"""Hangs become errors: a reward function that never returns (with 0 or 1 reward workers) and a worker stopped
with SIGSTOP (the per-phase timeout names the agent, the phase and the checkpoint to resume from)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from openrlhf_hacpo.rollout.reward_runner import RewardRunner, RewardTimeoutError

from fault_inputs import HANGING_REWARD, write_file


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.integration
def test_a_hanging_reward_function_times_out(tmp_path, workers):
    reward = write_file(tmp_path, "hangs.py", HANGING_REWARD)
    runner = RewardRunner(reward, num_workers=workers, timeout_s=2.0)
    start = time.monotonic()
    try:
        with pytest.raises(RewardTimeoutError, match=r"reward '.*hangs\.py' did not score 3 samples within 2.0 s"):
            runner(["a", "b", "c"], ["p", "p", "p"], ["1", "1", "1"])
    finally:
        runner.close()
    assert time.monotonic() - start < 30


@pytest.mark.e2e
def test_a_stopped_worker_hits_the_phase_timeout(tmp_path):
    """A Ray worker stopped with SIGSTOP during an update: the wait ends after --step_timeout with a TrainingError
    naming the agent, the phase and the last checkpoint."""
    ray = pytest.importorskip("ray")
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.controller import HACPOController, TrainingError

    @ray.remote(num_cpus=0)
    class Worker:
        def pid(self) -> int:
            return os.getpid()

        def train_step(self, seconds: float) -> str:
            time.sleep(seconds)
            return "done"

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    worker = Worker.remote()
    pid = ray.get(worker.pid.remote())
    try:
        cfg = build_config(["--agent", "name=llama,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path",
                            str(tmp_path), "--step_timeout", "3", "--n_samples_per_prompt", "2",
                            "--rollout_batch_size", "2", "--train_batch_size", "4", "--micro_train_batch_size", "2"])
        group = AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=1)
        group.policies = [worker]
        os.kill(pid, signal.SIGSTOP)
        controller = HACPOController(cfg)
        controller.checkpoints.last_checkpoint = tmp_path / "checkpoints" / "global_step4"
        start = time.monotonic()
        with pytest.raises(TrainingError) as info:
            controller._guard(lambda: group.all_policies(PolicyWorker.train_step, 0.1).result(), "step 5")
        waited = time.monotonic() - start
        message = str(info.value)
        assert message.startswith("step 5 failed: agent 'llama', policy rank 0, node unknown, phase update: no "
                                  "result within 3 s (--step_timeout)")
        assert message.endswith(f"Last complete checkpoint: {tmp_path}/checkpoints/global_step4; resume with: the "
                                "same command with --resume")
        assert 2.5 < waited < 30
    finally:
        os.kill(pid, signal.SIGCONT)
        ray.kill(worker)
        if started:
            ray.shutdown()


def test_phase_timeout_is_the_step_timeout_flag():
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.cli.train_hacpo import build_config

    def group(cfg):
        return AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[0], 1)

    flags = ["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--n_samples_per_prompt", "2",
             "--rollout_batch_size", "2", "--train_batch_size", "4", "--micro_train_batch_size", "2"]
    assert group(build_config(flags + ["--step_timeout", "42"])).timeout_s == 42.0
    assert group(build_config(flags + ["--step_timeout", "0"])).timeout_s is None
    assert build_config(flags).cluster.step_timeout == 3600.0
