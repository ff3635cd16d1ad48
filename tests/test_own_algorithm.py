"""docs/own_algorithm.md and examples/my_algorithm.py (issue 65, item 2): a user's own RL algorithm written against
memenv's public pieces. The example runs end to end in a few updates; its loss reads what the records hold (the
re-scored log-probs are the sampler's, the advantage has the right sign, the weights move); the page's LossHook
is the code the PPO/GRPO trainer calls."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from llm_common import ToyYes, tiny_model, toy_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_algorithm.py"
PAGE = ROOT / "docs" / "own_algorithm.md"


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(EXAMPLE), run_name="my_algorithm")


@pytest.fixture(scope="module")
def start(tmp_path_factory, example):
    """A fresh tiny checkpoint on the example's env (its actions are invalid: all returns equal)."""
    from agents.llm.models.local import make_tiny

    folder = tmp_path_factory.mktemp("start")
    make_tiny(folder, env_kwargs=example["Args"]().env_kwargs, episodes=4, include_corpus=False, vocab_size=300,
              hidden_size=32, layers=2, heads=2)
    return folder


def toy_records(seed: int = 0, n: int = 8, temperature: float = 1.0):
    from agents.llm import LLMPolicy, records_of, rollout

    tok = toy_tokenizer()
    model = tiny_model(tok, seed=seed)
    policy = LLMPolicy(model, tok, temperature=temperature, max_new_tokens=4, seed=seed)
    episodes = rollout(policy, [ToyYes() for _ in range(4)], [7] * n, groups=[0] * (n // 2) + [1] * (n - n // 2))
    return model, tok, episodes, records_of(episodes)


def test_the_example_runs_updates_on_memqa_from_a_checkpoint(example, start, tmp_path, capsys):
    result = example["main"](["--out", str(tmp_path / "run"), "--start", str(start), "--updates", "2",
                              "--tasks-per-update", "2", "--group-size", "2", "--max-new-tokens", "6"])
    assert len(result["returns"]) == 2 and all(-2.0 <= r <= 1.0 for r in result["returns"])
    assert torch.isfinite(torch.tensor(result["loss"]))
    records = result["records"]
    assert len({r.episode_id for r in records}) == 4 and {r.group for r in records} == {10_002, 10_003}
    for r in records:  # what the loss reads
        assert len(r.prompt_ids) > 0 and 0 < len(r.response_ids) <= 6 and len(r.action_mask) == len(r.response_ids)
        assert r.advantage is not None and r.temperature == 1.0 and r.group is not None
        assert "valid" in r.snapshot and r.snapshot["turn"] == r.turn
    assert "update 2: mean return" in capsys.readouterr().out
    assert not (tmp_path / "run" / "sft").exists()  # --start: no behaviour cloning


def test_rloo_advantages_are_leave_one_out_per_group(example):
    from agents.llm.records.invocation import InvocationRecord
    from agents.llm.records.rollouts import Episode

    def episode(name, group, reward, turns=2):
        records = [InvocationRecord(name, t, [1], [2], [-0.1], [1], [0], reward=reward if t == turns else 0.0)
                   for t in range(1, turns + 1)]
        return Episode(name, 0, records, group=group)

    episodes = [episode("a", 0, 1.0), episode("b", 0, 0.0), episode("c", 0, 0.5), episode("d", 1, 0.2, 1),
                episode("e", 1, 0.6, 3)]
    example["rloo_advantages"](episodes)
    expected = {"a": 1.0 - 0.25, "b": 0.0 - 0.75, "c": 0.5 - 0.5, "d": 0.2 - 0.6, "e": 0.6 - 0.2}
    for ep in episodes:
        assert [r.advantage for r in ep.records] == pytest.approx([expected[ep.episode_id]] * ep.turns)


def test_the_loss_scores_the_sampled_tokens_as_the_sampler_did(example):
    model, tok, _, records = toy_records(temperature=0.7)
    logps = example["token_logprobs"](model, records, tok.pad_token_id)
    for r, lp in zip(records, logps):
        assert lp.tolist() == pytest.approx(r.response_logprobs, abs=1e-4)


def test_one_step_raises_the_positive_advantage_and_lowers_the_negative(example):
    model, tok, episodes, records = toy_records(seed=3)
    for r in records:
        r.advantage = 0.0
    up, down = records[0], next(r for r in records if r.response_ids != records[0].response_ids)
    up.advantage, down.advantage = 1.0, -1.0
    before = [p.detach().clone() for p in model.parameters()]
    seq = lambda r: example["token_logprobs"](model, [r], tok.pad_token_id)[0].sum().item()  # noqa: E731
    old_up, old_down = seq(up), seq(down)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = example["rloo_loss"](model, records, tok.pad_token_id, micro_batch=3)  # 3 micro-batches of a minibatch
    optimizer.step()
    assert torch.isfinite(torch.tensor(loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert seq(up) > old_up and seq(down) < old_down


def page_blocks() -> list[str]:
    """The page's Python blocks (fenced ``py``: an excerpt of the example and the hook, both tested here rather
    than pasted whole, since they need the example's variables or its checkpoint)."""
    return re.findall(r"^```py\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)


def page_hook_block() -> str:
    found = [b for b in page_blocks() if "class RLOOHook" in b]
    assert len(found) == 1, "docs/own_algorithm.md: one python block defines RLOOHook"
    return found[0]


def test_the_pages_loop_is_the_examples_loop():
    """The loop the page shows is the example's, line for line (comments aside), so the two cannot drift."""
    loop = next(b for b in page_blocks() if "rollout(policy, envs, seeds" in b)
    source = [line.split("  #")[0].strip() for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    for line in loop.splitlines():
        code = line.split("  #")[0].strip()
        assert code in source, f"docs/own_algorithm.md shows {code!r}, which examples/my_algorithm.py does not have"


def test_the_pages_loss_hook_is_called_by_the_grpo_trainer(tmp_path):
    """The page's block as written: its hook in ``train_rl`` (toy env, 2 updates) is called on every minibatch
    with nonzero advantages; its last lines build a PPOConfig and hand the hook to ``train_rl``."""
    from agents.llm.training.ppo import PPOConfig, train_rl

    code = page_hook_block()
    definitions, _, usage = code.partition("\ncfg = ")
    namespace: dict = {}
    exec(compile(definitions, str(PAGE), "exec"), namespace)
    hook = namespace["RLOOHook"]()
    calls = []
    original = hook.__call__

    class Counting(type(hook)):
        def __call__(self, records, actor):
            term, metrics = original(records, actor)
            calls.append(float(term.detach()))
            return term, metrics

    hook.__class__ = Counting
    tok = toy_tokenizer()
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path / "rl"), updates=2, episodes_per_update=16, group_size=8,
                    lr=3e-3, max_new_tokens=4, num_envs=8, eval_every=0, save_every=100, progress=False, epochs=1,
                    num_minibatches=2)
    row = train_rl(cfg, model=tiny_model(tok, seed=1), tokenizer=tok, env_fn=ToyYes, extra_loss=hook)
    assert len(calls) == 4 and any(c != 0.0 for c in calls)  # 2 updates x 2 minibatches
    assert "rloo_loss" in row and row["update"] == 2
    # the usage lines: a PPOConfig on the example's checkpoint and env, the hook handed to train_rl
    seen = {}
    namespace["train_rl"] = lambda cfg, **kw: seen.update(cfg=cfg, **kw)
    exec(compile("cfg = " + usage, str(PAGE), "exec"), namespace)
    assert isinstance(seen["extra_loss"], namespace["RLOOHook"]) and isinstance(seen["cfg"], PPOConfig)
    args = runpy.run_path(str(EXAMPLE), run_name="my_algorithm")["Args"]()
    assert seen["cfg"].env_kwargs == args.env_kwargs
    assert seen["cfg"].model == f"{args.out}/sft/checkpoint-{args.sft_steps:07d}"
