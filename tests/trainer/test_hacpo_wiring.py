"""What reaches the loss in a real HACPO step, against hand-computed values.

The capability tracker's ratio matrix is fixed by hand (P̂ = 0.2, 0.5, 0.8 for agents 0, 1, 2, so
R[a, b] = P̂_a / P̂_b is far from symmetric). One step of 2 or 3 heterogeneous agents runs through the CLI
(``--no_ray``); a spy on the policy worker records, for every micro-batch, its rows and the ``PolicyLossInput`` the
loss receives. For learner k and a row from source j the test expects:

* advantages: eq. 6-8 over all of learner k's rows of the prompt, with ω^(k,j) = R[k, j] in the baseline
  (written out independently in tests/hacpo_reference.py);
* coefficient: 1 on own rows, ω^(j,k) = R[j, k] on foreign rows (eq. 10);
* own flag: j == k; old log-prob mean: the source's own value carried by the trajectory.

Swapping the direction of either ratio (R[:, k] in the baseline, or R[k, j] as the coefficient) changes the values
and fails this test.
"""
from __future__ import annotations

import pytest
import torch

from hacpo_reference import reference_advantages
from openrlhf_hacpo.actors.update_loop import UpdateLoop
from openrlhf_hacpo.algorithms.capability import CapabilityTracker
from openrlhf_hacpo.cli.train_hacpo import run

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

CAPABILITIES = [0.2, 0.5, 0.8]


@pytest.mark.parametrize("names", [("qwen", "llama"), ("llama", "qwen", "llama2")], ids=["2agents", "3agents"])
def test_advantages_coefficients_and_flags_reaching_the_loss(tmp_path, tiny_agents, base_args, monkeypatch, names):
    n = len(names)
    p_hat = torch.tensor(CAPABILITIES[:n], dtype=torch.float64)
    ratio = p_hat[:, None] / p_hat[None, :]
    monkeypatch.setattr(CapabilityTracker, "ratio_matrix", lambda self: ratio.clone())

    records, views = [], {}
    original, original_view = UpdateLoop.loss_of, UpdateLoop.learner_batch

    def view_spy(self, trajectories):
        views[self.agent_index] = original_view(self, trajectories)
        return views[self.agent_index]

    def spy(self, micro, logp, entropy, m, totals, ref_logp, params):
        """Every loss call of the update: rows with gradient, and rows skipped for having none (their loss still
        counts)."""
        seen = []
        loss_fn = self.loss_fn

        def capture(inp, cfg, **kwargs):
            seen.append(inp)
            return loss_fn(inp, cfg, **kwargs)

        self.loss_fn = capture
        try:
            out = original(self, micro, logp, entropy, m, totals, ref_logp, params)
        finally:
            self.loss_fn = loss_fn
        batch = views[self.agent_index]
        records.append((self.agent_index, [batch.rows[i] for i in micro.row_index.tolist()], seen[0]))
        return out

    monkeypatch.setattr(UpdateLoop, "loss_of", spy)
    monkeypatch.setattr(UpdateLoop, "learner_batch", view_spy)
    agents = [a for name in names for a in ("--agent", f"name={name},pretrain={tiny_agents[name]}")]
    run(base_args(tmp_path, "--no_ray", *agents, "--algorithm", "hacpo", "--train_batch_size", "4",
                  "--max_steps", "1"))

    for k in range(n):
        mine = [(rows, inp) for agent, rows, inp in records if agent == k]
        assert mine, f"learner {k} trained on nothing"
        rows = [row for batch_rows, _ in mine for row in batch_rows]
        assert len({id(r) for r in rows}) == len(rows) == n * 8  # every row of the step once: 2 prompts x G = 4
        adv, _, _ = reference_advantages([r.reward for r in rows], [r.prompt_id for r in rows],
                                         [r.source for r in rows], k, ratio[k].tolist())
        expected = {id(r): a for r, a in zip(rows, adv)}
        assert any(a != 0 for a in adv), "the parity reward gave no signal; the check would be empty"
        for batch_rows, inp in mine:
            for i, row in enumerate(batch_rows):
                j = row.source
                assert bool(inp.is_own[i]) == (j == k)
                assert float(inp.advantages[i]) == pytest.approx(expected[id(row)], abs=1e-5), (k, j)
                want_coef = 1.0 if j == k else float(ratio[j, k])
                assert float(inp.coef[i]) == pytest.approx(want_coef, rel=1e-6), (k, j)
                assert float(inp.old_logp_mean[i]) == pytest.approx(row.old_logp_mean, abs=1e-6)
    foreign = [(k, row.source) for k, rows, _ in records for row in rows if row.source != k]
    assert foreign and all(float(ratio[j, k]) != float(ratio[k, j]) for k, j in foreign)
