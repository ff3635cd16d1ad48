"""TRL environment_factory for memory-tools mode (agents.llm.adapters.trl_tools): each tool call is the env step of the
equivalent action text; the tools' schemas are what TRL builds; two GRPO steps of TRL with it on a tiny
tool-calling chat model (CPU) move the weights, with rewards from the env's summary.

The tiny model is random, so a forward hook steers it: it emits one tool-call transcript, choosing at random
between answering the gold answer and a wrong one (:class:`ScriptedToolCalls`). Everything else (parsing the
calls, running the tools, the growing transcript, the rewards, the GRPO update) is TRL's and memenv's own.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.llm.adapters.trl_tools import DEFAULT_PREAMBLE, BeamToolEnv, LongMemEvalToolEnv, MemQAToolEnv, tool_dataset
from memenv.memory_tools import format_tool_call

MEMQA_KW = {"objectives": 1, "max_turns": 6}


def _tools(env) -> list[str]:
    """The tool names TRL takes from an environment (its rule: public functions of the class but reset/get_reward)."""
    return [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


def test_the_tools_are_the_memory_tools_with_schemas():
    from transformers.utils import get_json_schema

    memqa, beam = MemQAToolEnv(**MEMQA_KW), BeamToolEnv(chat_tokens=4000, max_tool_calls=3)
    assert _tools(memqa) == ["answer", "mem_add", "mem_delete", "mem_search", "mem_update", "search"]
    assert _tools(beam) == ["answer", "mem_add", "mem_delete", "mem_search", "mem_update", "next_session"]
    schema = get_json_schema(memqa.mem_update)["function"]
    assert schema["parameters"]["required"] == ["entry_id", "text"]
    assert schema["parameters"]["properties"]["entry_id"]["type"] == "integer"
    for env in (memqa, beam):
        for name in _tools(env):
            function = get_json_schema(getattr(env, name))["function"]
            assert function["name"] == name and function["description"]


def test_each_tool_call_is_the_env_step_of_its_action_text():
    tool_env = MemQAToolEnv(**MEMQA_KW)
    env = gym.make("MemQA-v0", memory_mode="tools", **MEMQA_KW)
    first = tool_env.reset(seed=3)
    obs, info = env.reset(seed=3)
    assert first == DEFAULT_PREAMBLE + obs
    gold = env.unwrapped.questions[0].answers[0]
    calls = [("mem_add", {"text": "Q1 is about a capital"}), ("mem_update", {"entry_id": 9, "text": "no such"}),
             ("mem_search", {"query": "capital"}), ("search", {"query": "capital"}),
             ("mem_delete", {"entry_id": 1}), ("answer", {"answers": gold})]
    for name, arguments in calls:
        result = getattr(tool_env, name)(**arguments)
        action = format_tool_call("answer" if name == "answer" else name,
                                  arguments.get("text", arguments.get("query", arguments.get("answers", ""))),
                                  arguments.get("entry_id"))
        obs, reward, terminated, truncated, info = env.step(action)
        assert tool_env.snapshots[-1] == info["invocation"]
        assert tool_env.reward == reward
        if not terminated:
            assert obs.endswith(result) and "<task>" not in result  # what the env shows next, less the task block
    assert terminated and "Episode over (answered)" in result
    assert tool_env.get_reward() == info["summary"]["f1"] == 1.0
    assert not tool_env.snapshots[1]["valid"]  # the unknown id: an invalid step, its message returned
    with pytest.raises(RuntimeError, match="episode is over"):
        tool_env.search("more")
    tool_env.reset(seed=4)
    assert tool_env.get_reward() == 0.0  # not answered (yet): no reward


def test_longmemeval_items_play_through_the_same_tools(longmemeval_path):
    tool_env = LongMemEvalToolEnv(data_path=longmemeval_path)
    env = gym.make("MemDialog-LongMemEval-v0", memory_mode="tools", data_path=longmemeval_path)
    assert _tools(tool_env) == _tools(BeamToolEnv(chat_tokens=4000, max_tool_calls=3))
    first = tool_env.reset(seed=0)
    obs, _ = env.reset(seed=0)
    assert first == DEFAULT_PREAMBLE + obs
    calls = [("mem_add", {"text": "session 0: a greeting"}), ("next_session", {}),
             ("mem_add", {"text": "the user's dog is called Biscuit"}), ("next_session", {}),
             ("answer", {"answer": "Biscuit"})]
    for name, arguments in calls:
        result = getattr(tool_env, name)(**arguments)
        action = format_tool_call("next" if name == "next_session" else name,
                                  arguments.get("text", arguments.get("answer", "")))
        obs, reward, terminated, truncated, info = env.step(action)
        assert tool_env.snapshots[-1] == info["invocation"] and tool_env.reward == reward
        if terminated:
            break
    assert terminated, "the item's question was answered"
    assert tool_env.get_reward() == info["summary"]["score"] > 0.5  # "Biscuit" is the item's answer


def test_the_tool_env_plays_on_an_openenv_server():
    pytest.importorskip("openenv.core.env_server", reason="openenv not installed: pip install 'memenv[openenv]'")
    from memenv.openenv import BackgroundServer

    with BackgroundServer("MemQA-v0", {"memory_mode": "tools", **MEMQA_KW}) as server:
        served, local = MemQAToolEnv(url=server.url), MemQAToolEnv(**MEMQA_KW)
        assert served.reset(seed=5) == local.reset(seed=5)
        for env in (served, local):
            env.mem_add("a note")
            env.answer("x")
        assert json.loads(json.dumps(local.snapshots)) == served.snapshots
        assert served.get_reward() == local.get_reward()
        served.env.close()
        with pytest.raises(ValueError, match="kwargs are set by"):
            MemQAToolEnv(url=server.url, objectives=2)
        with pytest.raises(ValueError, match="needs a MemDialog-BEAM-v0 server"):
            BeamToolEnv(url=server.url)


def test_a_server_of_the_same_env_in_another_memory_mode_is_refused():
    # A rewrite-mode MemQA server took every tool call as an invalid step: F1 0, silently.
    pytest.importorskip("openenv.core.env_server", reason="openenv not installed: pip install 'memenv[openenv]'")
    from memenv.openenv import BackgroundServer

    with BackgroundServer("MemQA-v0", MEMQA_KW) as server:
        with pytest.raises(ValueError, match=r"^MemQAToolEnv needs a MemQA-v0 server with memory_mode='tools'; "
                                             r"http://\S+ serves MemQA-v0 with max_turns=6, objectives=1$"):
            MemQAToolEnv(url=server.url)
    with BackgroundServer("MemDialog-BEAM-v0", {"chat_tokens": 4000, "memory_mode": "rewrite"}) as server:
        with pytest.raises(ValueError, match="BeamToolEnv needs a MemDialog-BEAM-v0 server with memory_mode='tools'"):
            BeamToolEnv(url=server.url)
    with BackgroundServer("MemDialog-BEAM-v0", {"chat_tokens": 4000}) as server:  # tools is BEAM's default mode
        served = BeamToolEnv(url=server.url)
        served.reset(seed=0)
        served.mem_add("a note")
        assert served.snapshots[-1]["valid"] and served.snapshots[-1]["tool"] == "mem_add"
        served.env.close()


def test_answer_takes_a_list_of_answers_one_per_objective():
    env = MemQAToolEnv(objectives=2, max_turns=6)
    env.reset(seed=1)
    golds = [q.answers[0] for q in env.env.unwrapped.questions]
    result = env.answer(golds)  # the list's repr scored F1 0.40
    assert "Episode over (answered)" in result and env.get_reward() == 1.0
    assert env.snapshots[-1]["tool_input"] == "; ".join(golds)
    env.reset(seed=1)
    env.answer([golds[0], 3])
    assert env.snapshots[-1]["tool_input"] == f"{golds[0]}; 3" and env.get_reward() == 0.5


@pytest.mark.parametrize("tool, arguments", [
    ("mem_add", {"text": None}), ("mem_update", {"entry_id": 1, "text": None}), ("mem_search", {"query": None}),
    ("answer", {"answers": None}), ("mem_add", {"text": {"note": "x"}}), ("answer", {"answers": ["a", None]})])
def test_a_tool_call_without_text_is_refused_and_nothing_is_stored(tool, arguments):
    env = MemQAToolEnv(**MEMQA_KW)
    env.reset(seed=0)
    env.mem_add("kept")
    with pytest.raises(ValueError, match=f"^{tool}: its text must be a string"):
        getattr(env, tool)(**arguments)
    assert len(env.snapshots) == 1 and not env.done  # no step taken: the store holds "kept" only
    assert list(env.env.unwrapped.store.entries.values()) == ["kept"]


def test_a_tool_before_reset_says_reset_is_needed():
    env = MemQAToolEnv(**MEMQA_KW)
    with pytest.raises(RuntimeError, match=r"no episode yet: call reset\(\) before any tool call"):
        env.search("capital")
    env.reset(seed=0)
    env.answer("x")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.search("capital")


def test_tool_dataset_rows_seed_the_reset():
    data = tool_dataset(3, seed=10)
    assert data["seed"] == [10, 11, 12] and data[0]["prompt"] == [{"role": "user", "content": ""}]
    a, b = MemQAToolEnv(**MEMQA_KW), MemQAToolEnv(**MEMQA_KW)
    assert a.reset(**data[1]) == b.reset(**data[1])
    with pytest.raises(ValueError, match="num_tasks"):
        tool_dataset(0)


# ---------------------------------------------------------------------------------------------- GRPO with TRL
class ScriptedToolCalls:
    """Forward hooks that make any causal LM write a fixed tool-calling transcript: assistant turn ``k`` (after
    ``k`` tool responses) is one of ``turns[k]`` (the last entry repeats), chosen by the model's own sampling where
    the candidates branch, uniformly. A bias on the next token of every candidate the turn so far agrees with;
    none once it agrees with none. The same bias is on in TRL's training forward, so the sampled and the
    recomputed log-probs agree. It follows the whole sequence: a forward of several tokens (a prefill, a training
    forward) sets it, a one-token forward (a cached decoding step) extends it."""

    def __init__(self, model, tokenizer, turns: list[list[str]], strength: float = 30.0) -> None:
        import torch

        enc = functools.partial(tokenizer.encode, add_special_tokens=False)
        self.turns = [[enc(text) for text in candidates] for candidates in turns]
        self.header = enc("<|im_start|>assistant\n")
        self.response = enc("<tool_response>")
        self.strength, self.torch = strength, torch
        self.rows: list[list[int]] = []
        self.starts: list[int | None] = []
        model.register_forward_pre_hook(self._keep, with_kwargs=True)
        model.get_output_embeddings().register_forward_hook(self._bias)

    def _keep(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None).tolist()
        if len(ids[0]) == 1 and len(ids) == len(self.rows):  # a decoding step: one new token per row
            for row, new in zip(self.rows, ids):
                row += new
            return
        h = len(self.header)
        self.rows = ids
        self.starts = [next((i + h for i in range(len(r) - h + 1) if r[i:i + h] == self.header), None) for r in ids]

    def _next_tokens(self, row: list[int], p: int, start: int) -> set[int]:
        """The tokens the script allows after ``row[:p + 1]``, the completion starting at ``start``."""
        h = len(self.header)
        last = max((i + h for i in range(start - h, p - h + 2) if row[i:i + h] == self.header), default=None)
        m = len(self.response)
        k = sum(row[i:i + m] == self.response for i in range(start, p + 2 - m))  # tool responses so far
        turn = row[last:p + 1]
        candidates = self.turns[min(k, len(self.turns) - 1)]
        return {c[len(turn)] for c in candidates if len(c) > len(turn) and c[:len(turn)] == turn}

    def _bias(self, module, args, output):
        """Lift every allowed token to ``strength`` above the largest logit, all to the same value (a pretrained
        model's own preference must not decide the branch). The lift is a constant: gradients are the model's."""
        bias = self.torch.zeros_like(output)
        top = output.detach().amax(dim=-1)
        n = output.shape[1]
        for b, (row, start) in enumerate(zip(self.rows, self.starts)):
            if start is None:
                continue
            for j in range(n):
                p = len(row) - n + j
                if p + 1 >= start:
                    tokens = list(self._next_tokens(row, p, start))
                    if tokens:
                        bias[b, j, tokens] = top[b, j] + self.strength - output.detach()[b, j, tokens]
        return output + bias


def _tool_call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call><|im_end|>'


def _script(gold: str) -> list[list[str]]:
    return [[_tool_call("mem_add", text="Q1 asks for a capital")],
            [_tool_call("answer", answers=gold), _tool_call("answer", answers="unknown")],
            ["Done.<|im_end|>"]]


def _qwen_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


class _Recording(MemQAToolEnv):
    """Keeps every instance TRL makes, to read their episodes after training."""

    made: list = []

    def __init__(self, **kw):
        super().__init__(**kw)
        _Recording.made.append(self)


def _grpo(tmp_path, model, tokenizer, seed_row: int = 0, **config):
    import torch

    trl = pytest.importorskip("trl")
    gold = gym.make("MemQA-v0", memory_mode="tools", **MEMQA_KW)
    gold.reset(seed=seed_row)
    ScriptedToolCalls(model, tokenizer, _script(gold.unwrapped.questions[0].answers[0]))
    _Recording.made = []
    args = trl.GRPOConfig(**{
        "output_dir": str(tmp_path), "num_generations": 4, "per_device_train_batch_size": 4, "max_steps": 2,
        "learning_rate": 1e-2, "beta": 0.0, "max_completion_length": 400, "temperature": 1.0,
        "max_tool_calling_iterations": 3, "report_to": [],
        "logging_steps": 1, "save_strategy": "no", "bf16": False, "seed": 0, "disable_tqdm": True, **config})
    trainer = trl.GRPOTrainer(model=model, args=args, processing_class=tokenizer,
                              train_dataset=tool_dataset(1, seed=seed_row),
                              environment_factory=functools.partial(_Recording, **MEMQA_KW))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    torch.manual_seed(0)
    trainer.train()
    moved = sum((before[k] - v.detach()).abs().sum().item() for k, v in model.named_parameters())
    return trainer, moved


def _check_run(trainer, moved, steps: int = 2):
    episodes = [e for e in _Recording.made if e.snapshots]  # the first made is TRL's probe, then a rollout env
    assert episodes, "no rollout called a tool"
    for env in episodes:
        assert [s["tool"] for s in env.snapshots] == ["mem_add", "answer"] and env.done
        assert env.get_reward() == env.info["summary"]["f1"]
    rewards = [h for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == steps
    env_rewards = [h.get("rewards/_Recording/mean") for h in rewards]
    assert all(r is not None for r in env_rewards)  # the reward column is the env's get_reward
    assert {e.get_reward() for e in episodes} == {0.0, 1.0}  # right and wrong answers: a GRPO signal
    assert moved > 0


def test_two_grpo_steps_with_environment_factory_on_a_tiny_tool_model(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from transformers.utils import get_json_schema

    from agents.llm.models.local import build_tiny_model, build_tokenizer, task_texts

    torch.set_num_threads(1)
    texts = task_texts("MemQA-v0", {"memory_mode": "tools", **MEMQA_KW}, episodes=4) + [_qwen_template()]
    probe = MemQAToolEnv(**MEMQA_KW)
    texts += [json.dumps([get_json_schema(getattr(probe, name)) for name in _tools(probe)])] * 3  # the system prompt
    tokenizer = build_tokenizer(texts, vocab_size=1000, split_spaces="suffix", extra_tokens=[
        "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = _qwen_template()
    model = build_tiny_model(tokenizer, hidden_size=32, layers=2, heads=2, max_positions=8192)
    trainer, moved = _grpo(tmp_path, model, tokenizer)
    _check_run(trainer, moved)


@pytest.mark.real_model
@pytest.mark.skipif(not os.environ.get("MEMENV_SLOW_TESTS"), reason="3-7 CPU-minutes (a full SmolLM2 GRPO step over "
                    "tool transcripts; measured 194 s): set MEMENV_SLOW_TESTS=1")
def test_a_grpo_step_with_environment_factory_on_smollm2(tmp_path, smollm2_path):
    torch = pytest.importorskip("torch")
    from agents.llm.models.local import load_pretrained

    torch.set_num_threads(1)
    model, tokenizer = load_pretrained(smollm2_path)
    tokenizer.chat_template = _qwen_template()  # SmolLM2's ChatML template has no tools; Qwen's is ChatML + tools
    tokenizer.padding_side = "left"
    # One step (a 135M model's step takes minutes on 2 CPU cores); its sampled branch is fixed by the seeds.
    trainer, moved = _grpo(tmp_path, model, tokenizer, learning_rate=1e-5, max_steps=1)
    _check_run(trainer, moved, steps=1)
