"""The policy worker skips a non-finite update under ZeRO-1/2/3 as a whole: injected at the step's second update
(Adam's moments are non-zero by then), no parameter moves during that update and no Adam step counter advances.
DeepSpeed's ZeRO wrappers step the client optimizer once per parameter (sub-)group, so a skip that cleared itself
after the first call would still step the others."""
from __future__ import annotations

import pytest

from loss_injection import nan_loss_at
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.trainer.controller import HACPOController

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_second_update_skipped_under_zero(tmp_path, tiny_agents, base_args, stage):
    args = base_args(tmp_path, "--no_ray", "--algorithm", "gspo", "--agent",
                     f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "4", "--max_steps", "1",
                     "--zero_stage", stage, "--no_save_hf")
    controller = HACPOController(build_config(args))
    try:
        controller.setup()
        worker = controller.groups[0].policies[0]
        moved_while_skipping = []
        engine_step = worker.engine.step

        def recording_step(*a, **kw):
            if not worker.client_optimizer.skip_next_step:
                return engine_step(*a, **kw)
            before = worker.state_dict_for_sync()
            result = engine_step(*a, **kw)
            after = worker.state_dict_for_sync()
            moved_while_skipping.append(max(float((after[k] - before[k]).abs().max()) for k in before))
            return result

        worker.engine.step = recording_step
        nan_loss_at(worker, step=1, update_index=1)
        controller.fit()
        record = controller.history[0][0]
        assert record["updates"] == 2 and record["skipped_updates"] == 1
        assert moved_while_skipping == [0.0]
        counters = {float(state["step"]) for state in worker.client_optimizer.state.values()}
        assert counters == {1.0}, f"ZeRO-{stage}: Adam step counters {counters} after one applied update"
    finally:
        controller.close()
