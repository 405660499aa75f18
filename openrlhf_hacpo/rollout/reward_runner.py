"""The reward runner: a step's trajectories scored with a :class:`~openrlhf_hacpo.rollout.reward_fns.RewardFunction`,
in a spawn-context process pool or in the calling process, with an overall timeout either way.

A reward is computed once per trajectory, from the source agent's own response text, and reused by every learner, as in
the official code.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import threading
from typing import Any, Sequence

from openrlhf_hacpo.rollout.reward_fns import RewardFunction, RewardFunctionError, get_reward_fn

__all__ = ["RewardRunner", "RewardTimeoutError", "prompt_text_for_reward"]


class RewardTimeoutError(RewardFunctionError, TimeoutError):
    """The reward function did not score a batch within the runner's timeout."""


def prompt_text_for_reward(traj: Any) -> str:
    """The prompt handed to reward files: the source's rendered prompt (``metadata["prompt_text"]``) when known,
    else the raw prompt text, else the content of the last user message."""
    rendered = traj.metadata.get("prompt_text")
    if isinstance(rendered, str):
        return rendered
    if isinstance(traj.prompt, str):
        return traj.prompt
    users = [m for m in traj.prompt if m.get("role") == "user"] or traj.prompt
    return str(users[-1].get("content", ""))


# ------------------------------------------------------------------------------------------- runner
def _score_chunk(fn: RewardFunction, responses: list[str], prompts: list[str], labels: list) -> list[float]:
    return fn(responses, prompts, labels)


class RewardRunner:
    """Score batches with a reward function, in-process or in a spawn-context process pool.

    Args:
        fn: a :class:`RewardFunction`, a registered name or a reward file path.
        num_workers: 0 scores in the calling process; >= 1 uses that many worker processes.
        timeout_s: overall limit for one batch; on expiry :class:`RewardTimeoutError` is raised. Worker processes
            are killed (the pool restarts on the next call); in-process scoring runs in a daemon thread that is
            abandoned (Python cannot stop a thread), so the caller is released but the hung call keeps its thread.
            None waits forever.
        chunk_size: samples per task; default splits a batch evenly over the workers.
    """

    def __init__(
        self,
        fn: RewardFunction | str,
        num_workers: int = 0,
        timeout_s: float | None = None,
        chunk_size: int | None = None,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"RewardRunner.num_workers must be an int >= 0, got {num_workers!r}")
        if timeout_s is not None:
            if not timeout_s > 0:
                raise ValueError(f"RewardRunner.timeout_s must be > 0 or None, got {timeout_s!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"RewardRunner.chunk_size must be a positive int or None, got {chunk_size!r}")
        self.fn = get_reward_fn(fn)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self._pool: cf.ProcessPoolExecutor | None = None

    def __call__(self, responses: Sequence[str], prompts: Sequence[str], labels: Sequence[str | None]) -> list[float]:
        responses, prompts, labels = list(responses), list(prompts), list(labels)
        n = len(responses)
        if len(prompts) != n or len(labels) != n:
            raise ValueError(f"RewardRunner: {n} responses, {len(prompts)} prompts, {len(labels)} labels")
        if n == 0:
            return []
        if self.num_workers == 0:
            if self.timeout_s is None:
                return self.fn(responses, prompts, labels)
            return self._score_in_thread(responses, prompts, labels)
        size = self.chunk_size or -(-n // self.num_workers)
        pool = self._get_pool()
        futures = [
            pool.submit(_score_chunk, self.fn, responses[i : i + size], prompts[i : i + size], labels[i : i + size])
            for i in range(0, n, size)
        ]
        _, not_done = cf.wait(futures, timeout=self.timeout_s)
        if not_done:
            self._kill_pool()
            raise RewardTimeoutError(
                f"reward {self.fn.name!r} did not score {n} samples within {self.timeout_s} s "
                f"({len(not_done)} of {len(futures)} chunks unfinished)"
            )
        out: list[float] = []
        try:
            for fut in futures:
                out.extend(fut.result())
        except cf.process.BrokenProcessPool as err:
            self._kill_pool()
            raise RewardFunctionError(f"a worker process of reward {self.fn.name!r} died: {err}") from err
        return out

    def _score_in_thread(self, responses: list[str], prompts: list[str], labels: list) -> list[float]:
        """In-process scoring bounded by ``timeout_s``: the call runs in a daemon thread the caller waits on."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = self.fn(responses, prompts, labels)
            except BaseException as err:  # noqa: BLE001 - handed to the caller below
                box["err"] = err

        thread = threading.Thread(target=target, name=f"reward {self.fn.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise RewardTimeoutError(
                f"reward {self.fn.name!r} did not score {len(responses)} samples within {self.timeout_s} s "
                "(in-process scoring, --reward_num_workers 0: the hung call is abandoned; worker processes "
                "would be killed instead)")
        if "err" in box:
            raise box["err"]
        return box["out"]

    def score_trajectories(self, trajs: Sequence[Any]) -> list[float]:
        """Score trajectories from their own response text and store each reward in ``traj.reward``."""
        rewards = self(
            [t.response_text for t in trajs], [prompt_text_for_reward(t) for t in trajs], [t.label for t in trajs]
        )
        for traj, reward in zip(trajs, rewards):
            traj.reward = reward
        return rewards

    # --------------------------------------------------------------------------------------------- pool
    def _get_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.num_workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if hasattr(pool, "terminate_workers"):  # Python >= 3.14
            pool.terminate_workers()
            return
        # ProcessPoolExecutor before 3.14 cannot stop a running task; terminate its worker processes directly.
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for proc in processes:
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.join(timeout=5)

    def close(self) -> None:
        """Stop the worker processes. Between calls they are idle; a call still running (the caller was interrupted
        while waiting on it) is killed rather than waited for, so a hung reward cannot keep the run alive."""
        self._kill_pool()

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
