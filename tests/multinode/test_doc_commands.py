"""docs/multinode.md's shell blocks: every block says how it is tested, the commands run by
tests/multinode/test_two_node_runs.py are exactly the page's ``run`` commands, and the training commands and flag
fragments parse to the agents and pins the page describes (no Ray: the e2e module runs them)."""
from __future__ import annotations

import pytest

import doc_commands as doc
from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.cli.train_hacpo import build_config, parse_agent_spec
from openrlhf_hacpo.engines.node_plan import ClusterNode
from openrlhf_hacpo.trainer.preflight import check_node_placement

PLACEHOLDERS = {doc.HEAD_ADDRESS: "127.0.0.1:6379", "/models/": "/m/", "/data/train.jsonl": "train.jsonl",
                "/shared/runs/": "/tmp/runs/"}
REST = ["--n_samples_per_prompt", "2", "--rollout_batch_size", "2", "--train_batch_size", "4",
        "--micro_train_batch_size", "2"]


def test_every_shell_block_of_the_page_says_how_it_is_tested():
    found = doc.blocks()
    assert found, "docs/multinode.md has no ```bash block"
    untagged = [b.line for b in found if b.tag not in doc.TAGS]
    assert not untagged, (f"docs/multinode.md: the ```bash blocks at lines {untagged} have no '<!-- test: run | "
                          "gpu-only: REASON | flags -->' marker above them (tests/multinode/doc_commands.py)")
    assert all(b.reason for b in found if b.tag == "gpu-only"), "a gpu-only block must say why"
    assert all(b.commands for b in found)


def test_the_run_commands_are_the_ones_the_two_node_tests_run():
    # an added command needs a role here and a test that runs it
    assert [c.role for c in doc.commands("run")] == list(doc.ROLES)
    assert all(c.env.get("RAY_AUTH_MODE") == "token" for c in doc.commands("run") + doc.commands("gpu-only"))
    head, join = doc.command("start head"), doc.command("join node")
    assert "--port" in head.argv and doc.HEAD_ADDRESS.split(":")[1] == head.argv[head.argv.index("--port") + 1]
    assert join.argv[join.argv.index("--address") + 1] == doc.HEAD_ADDRESS
    assert doc.command("train by RAY_ADDRESS").env["RAY_ADDRESS"] == doc.HEAD_ADDRESS


def test_the_pin_examples_parse_to_the_nodes_their_comments_name():
    agents = [parse_agent_spec(c.argv[1]) for c in doc.commands("flags")]
    assert [(a.name, a.node) for a in agents] == [("qwen", "10.0.0.2"), ("llama", "nodeB")]


@pytest.mark.parametrize("role", ["train by --ray_address", "train by RAY_ADDRESS"])
def test_the_cpu_launches_pin_llama_to_the_head_and_qwens_two_ranks_to_the_other_node(role):
    cmd = doc.command(role)
    cfg = build_config(doc.substitute(cmd.argv[3:], PLACEHOLDERS, REST))
    assert cfg.cluster.device == "cpu"
    assert cfg.cluster.ray_address == ("127.0.0.1:6379" if "--ray_address" in cmd.argv else None)
    assert [(a.name, a.node, a.dp_size) for a in cfg.resolved_agents] == [("llama", "nodeA", 1), ("qwen", "nodeB", 2)]


def test_the_gpu_launch_plans_each_agent_on_its_own_node_of_8_gpus():
    (cmd,) = doc.commands("gpu-only")
    cfg = build_config(doc.substitute(cmd.argv[3:], PLACEHOLDERS, REST))
    a = ClusterNode("a" * 32, "10.0.0.1", 8, 8.0, frozenset({"nodeA"}))
    b = ClusterNode("b" * 32, "10.0.0.2", 8, 8.0, frozenset({"nodeB"}))
    qwen, llama = (p.nodes for p in check_node_placement(plan_agents(cfg, on_gpu=True), [b, a]))
    # each: 2 policy GPUs and 2 engines of one GPU; qwen4b pinned to nodeA, llama3b to the node with most free GPUs
    assert (qwen.policy, qwen.engines) == ((a.node_id,) * 2, (a.node_id,) * 2)
    assert (llama.policy, llama.engines) == ((b.node_id,) * 2, (b.node_id,) * 2)


def test_block_parsing_joins_continuations_reads_exports_and_finds_missing_markers():
    text = "\n".join(["<!-- test: run -->", "```bash", "# a comment", "export A=1 B=2", "run one \\",
                      "  --flag 'x y'   # trailing", "C=3 run two", "```", "", "```bash", "untested", "```",
                      "<!-- test: gpu-only: needs CUDA -->", "", "```bash", "gpu thing", "```"])
    first, second, third = doc.blocks(text)
    assert first.tag == "run" and [c.argv for c in first.commands] == [("run", "one", "--flag", "x y"),
                                                                       ("run", "two")]
    assert [dict(c.env) for c in first.commands] == [{"A": "1", "B": "2"}, {"A": "1", "B": "2", "C": "3"}]
    assert second.tag is None and second.line == 10
    assert (third.tag, third.reason) == ("gpu-only", "needs CUDA")
    assert doc.substitute(["--address", "10.0.0.1:6379", "--port", "6379", "..."],
                          {"10.0.0.1:6379": "127.0.0.1:46379", "6379": "46379", "10.0.0.1": "127.0.0.1"},
                          ["--x", "1"]) == ["--address", "127.0.0.1:46379", "--port", "46379", "--x", "1"]
