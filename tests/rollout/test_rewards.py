"""Built-in verifiers, reward files and the process-pool reward runner."""
import threading
import time

import pytest

from openrlhf_hacpo.rollout import (
    RewardFunctionError,
    RewardRunner,
    RewardTimeoutError,
    boxed_math,
    exact_match,
    get_reward_fn,
    make_trajectory,
)
from openrlhf_hacpo.rollout.reward_fns import register_reward_fn
from openrlhf_hacpo.rollout.verifiers import last_boxed_content, normalize_answer


# --------------------------------------------------------------------------------------------------- verifiers
@pytest.mark.parametrize(
    "raw, canonical",
    [(" 42 ", "42"), ("1,000", "1000"), ("42.0", "42"), ("42.", "42"), ("-0.50", "-0.5"), ("+7", "7"),
     ("1,234.500", "1234.5"), ("0.0", "0"), ("-0", "0"), ("1e3", "1000"), (" x+1 ", "x+1"), ("a, b", "a, b")],
)
def test_normalize_answer(raw, canonical):
    assert normalize_answer(raw) == canonical


def test_exact_match():
    assert exact_match("1,000.0", "1000") == 1.0
    assert exact_match(" 42\n", "42") == 1.0
    assert exact_match("42", "43") == 0.0
    assert exact_match("The answer is 42", "42") == 0.0  # the whole response is the answer
    with pytest.raises(ValueError, match="needs a label"):
        exact_match("1", None)


def test_last_boxed_content():
    assert last_boxed_content(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed_content(r"\boxed{4} then \boxed {3}") == "3"
    assert last_boxed_content(r"\boxed{4} then \boxed{3") == "4"  # an unclosed last box falls back
    assert last_boxed_content("no box") is None


@pytest.mark.parametrize(
    "response, label, expected",
    [(r"We get \boxed{\frac{1}{2}}", "0.5", 1.0), (r"\boxed{0.5}", r"\frac12", 1.0), (r"\boxed{3}", "4", 0.0),
     (r"first \boxed{4}, finally \boxed{3}", "3", 1.0), ("3", "3", 0.0), (r"\boxed{}", "3", 0.0),
     (r"\boxed{1,000}", "1000", 1.0), (r"\boxed{x^2+1}", "$1+x^2$", 1.0)],
)
def test_boxed_math(response, label, expected):
    assert boxed_math(response, label) == expected


def test_boxed_math_outside_the_main_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(boxed_math(r"\boxed{\sqrt{4}}", "2")))
    worker.start()
    worker.join(30)
    assert out == [1.0]


def test_registry():
    fn = get_reward_fn("exact_match")
    assert fn(["42", "x"], ["q", "q"], ["42", "42"]) == [1.0, 0.0]
    from openrlhf_hacpo.data.arithmetic import arithmetic_reward

    arith = get_reward_fn("arithmetic")
    responses = ["12 + 30 = 42", "12 + 30 = 41"]
    assert arith(responses, ["", ""], ["42", "42"]) == [arithmetic_reward(r, "42") for r in responses]
    with pytest.raises(ValueError, match="unknown reward 'nope'.*boxed_math"):
        get_reward_fn("nope")
    with pytest.raises(ValueError, match="module-level"):
        register_reward_fn("lambda", lambda r, l: 1.0)
    with pytest.raises(RewardFunctionError, match="raised ValueError on sample 1: exact_match needs a label"):
        fn(["1", "2"], ["", ""], ["1", None])


# --------------------------------------------------------------------------------------------------- reward files
GOOD = """
import torch
def reward_func(queries, prompts, labels):
    return torch.tensor([float(q[len(p):].strip() == l) for q, p, l in zip(queries, prompts, labels)])
"""
GOOD_PLAIN = "def reward_func(queries, prompts, labels):\n    return [float(q == l) for q, l in zip(queries, labels)]\n"
DICT = "def reward_func(queries, prompts, labels):\n    return {'rewards': [0.25] * len(queries), 'scores': []}\n"
RAISES = "def reward_func(queries, prompts, labels):\n    raise KeyError('label-missing')\n"
SHORT = "def reward_func(queries, prompts, labels):\n    return [1.0]\n"
NAN = "def reward_func(queries, prompts, labels):\n    return [float('nan')] * len(queries)\n"
TEXT = "def reward_func(queries, prompts, labels):\n    return ['high'] * len(queries)\n"
SLEEPS = "import time\ndef reward_func(queries, prompts, labels):\n    time.sleep(60)\n    return [0.0]\n"
NO_FUNC = "def reward(queries, prompts, labels):\n    return []\n"
BROKEN = "def reward_func(:\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reward_file_good_and_dict(tmp_path):
    fn = get_reward_fn(write(tmp_path, "good.py", GOOD))
    assert fn(["7", " 8", "9"], ["Q:", "Q:", "Q:"], ["7", "8", "1"]) == [1.0, 1.0, 0.0]
    assert get_reward_fn(write(tmp_path, "d.py", DICT))(["a", "b"], ["", ""], [None, None]) == [0.25, 0.25]


@pytest.mark.parametrize(
    "name, text, pattern",
    [("raises.py", RAISES, r"reward_func in .*raises\.py raised KeyError: 'label-missing'"),
     ("short.py", SHORT, r"reward_func in .*short\.py returned 1 rewards for 2 samples"),
     ("nan.py", NAN, r"reward_func in .*nan\.py returned a non-finite reward nan for sample 0"),
     ("text.py", TEXT, r"reward_func in .*text\.py returned a non-numeric reward 'high' for sample 0")],
)
def test_reward_file_errors_name_the_file(tmp_path, name, text, pattern):
    fn = get_reward_fn(write(tmp_path, name, text))
    with pytest.raises(RewardFunctionError, match=pattern):
        fn(["a", "b"], ["", ""], ["1", "2"])


def test_reward_file_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward file .*missing\.py does not exist"):
        get_reward_fn(str(tmp_path / "missing.py"))
    with pytest.raises(RewardFunctionError, match=r"nofunc\.py does not define a function reward_func"):
        get_reward_fn(write(tmp_path, "nofunc.py", NO_FUNC))
    with pytest.raises(RewardFunctionError, match=r"importing reward file .*broken\.py failed: SyntaxError"):
        get_reward_fn(write(tmp_path, "broken.py", BROKEN))


# --------------------------------------------------------------------------------------------------- runner
def test_runner_in_process_scores_trajectories():
    runner = RewardRunner("boxed_math")
    trajs = [
        make_trajectory(prompt_id=f"p{i}", prompt=[{"role": "user", "content": "q"}], label="2", source=0, step=0,
                        token_ids=[1, 9], token_logps=[-1.0, -1.0], eos_token_id=9, response_text=text)
        for i, text in enumerate([r"\boxed{2}", r"\boxed{3}"])
    ]
    assert runner.score_trajectories(trajs) == [1.0, 0.0]
    assert [t.reward for t in trajs] == [1.0, 0.0]
    with RewardRunner("boxed_math", num_workers=0, timeout_s=60.0) as bounded:
        assert bounded.score_trajectories(trajs) == [1.0, 0.0]


@pytest.mark.integration
def test_runner_process_pool_good_raising_and_timeout(tmp_path):
    """One worker process (spawn) serves the good file, reports the raising file, and is killed on a timeout."""
    good = write(tmp_path, "good_plain.py", GOOD_PLAIN)
    with RewardRunner(good, num_workers=1, timeout_s=60, chunk_size=2) as runner:
        assert runner(["1", "2", "3"], ["", "", ""], ["1", "0", "3"]) == [1.0, 0.0, 1.0]
    with RewardRunner(write(tmp_path, "raises.py", RAISES), num_workers=1, timeout_s=60) as runner:
        with pytest.raises(RewardFunctionError, match=r"raises\.py raised KeyError"):
            runner(["a"], [""], ["1"])
    runner = RewardRunner(write(tmp_path, "sleeps.py", SLEEPS), num_workers=1, timeout_s=1.5)
    start = time.monotonic()
    with pytest.raises(RewardTimeoutError, match=r"sleeps\.py' did not score 2 samples within 1.5 s"):
        runner(["a", "b"], ["", ""], ["1", "2"])
    assert time.monotonic() - start < 30
    assert runner._pool is None  # the stuck worker was killed; a later call starts a fresh pool
    runner.close()
