"""verl adapter: a memenv episode as a verl agent loop, one output per invocation (targets verl 0.9.1).

verl's agent loops (``verl.experimental.agent_loop``) run one coroutine per dataset sample: ``run(sampling_params,
**sample_fields)`` asks the rollout servers for tokens through ``server_manager.generate(request_id,
prompt_ids=..., sampling_params=...)`` and returns an ``AgentLoopOutput`` (``prompt_ids``, ``response_ids``,
``response_mask``, ``response_logprobs``, ``reward_score``, ``num_turns``, ``extra_fields``). Under verl's v1
trainer a loop may return a *list* of outputs; GRPO takes the advantage from the last one and broadcasts it to
all of them. memenv uses that for memory mode: every invocation is its own sequence (prompt = that turn's
observation with the rewritten memory), so one episode is a list of outputs, one per invocation, each
``response_mask`` all ones, the episode's return as ``reward_score`` on every output.

The loop logic lives in :class:`MemenvEpisodeLoop`, which needs no verl (it is tested on CPU against a fake
server backed by a tiny model); :class:`MemenvAgentLoop` is the thin ``AgentLoopBase`` subclass, registered as
``memenv_agent`` and defined only when verl imports. Launch recipe and config: ``docs/verl.md``. Not run
end-to-end here (verl training needs GPUs with vLLM/SGLang; verl pins ``transformers<5.11``).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Sequence
from uuid import uuid4

import gymnasium as gym

import memenv  # noqa: F401 - registers the environments
from agents.llm.generation.policy import DEFAULT_STOP, PromptFormat
from agents.llm.records.exchange import InvocationOutput  # defined with the other exporters' rows

VERL_TARGETED = "0.9.1"
AGENT_NAME = "memenv_agent"

# The dataset row of one task: verl passes its non-tensor fields to ``run`` as keyword arguments; the
# ``extra_info`` dict is the usual place for per-sample fields in verl datasets.
SAMPLE_FIELDS = ("env_id", "seed", "env_kwargs")


def _token_ids(output: Any) -> tuple[list[int], list[float] | None]:
    """``(token_ids, log_probs)`` of a verl ``TokenOutput`` (or a dict with those keys)."""
    get = output.get if isinstance(output, dict) else lambda k, d=None: getattr(output, k, d)
    ids = list(get("token_ids"))
    logps = get("log_probs")
    return ids, None if logps is None else [float(v) for v in logps]


class MemenvEpisodeLoop:
    """One memenv episode driven through an async token server (verl's ``server_manager`` interface).

    Args:
        server: has ``async generate(request_id, *, prompt_ids, sampling_params)`` returning an object (or dict)
            with ``token_ids`` and ``log_probs``.
        tokenizer: the policy's tokenizer (prompts are encoded with
            :class:`agents.llm.generation.policy.PromptFormat`, as in :class:`agents.llm.generation.policy.LLMPolicy`).
        response_length: max tokens per invocation (``max_tokens`` sent to the server).
        stop: strings that end an action (sent as vLLM/SGLang ``stop``, kept in the output).
        template, system_prompt, max_prompt_tokens: as in :class:`agents.llm.generation.policy.LLMPolicy`.
    """

    def __init__(self, server, tokenizer, *, response_length: int = 256, stop: Sequence[str] = DEFAULT_STOP,
                 template: str = "auto", system_prompt: str | None = "checkpoint",
                 max_prompt_tokens: int | None = None) -> None:
        if response_length < 1:
            raise ValueError(f"response_length must be >= 1, got {response_length}")
        self.server = server
        self.tokenizer = tokenizer
        self.format = PromptFormat(tokenizer, template, system_prompt, max_prompt_tokens=max_prompt_tokens)
        self.response_length = int(response_length)
        self.stop = tuple(stop)

    def sampling_params(self, sampling_params: dict[str, Any]) -> dict[str, Any]:
        """verl's sampling params plus the stop strings and the per-invocation token limit."""
        return {**sampling_params, "stop": list(self.stop), "include_stop_str_in_output": True,
                "max_tokens": self.response_length, "logprobs": sampling_params.get("logprobs", True)}

    async def run(self, sampling_params: dict[str, Any], env_id: str = "MemQA-v0", seed: int | None = None,
                  env_kwargs: dict[str, Any] | None = None) -> list[InvocationOutput]:
        """Play one episode of ``env_id`` (reset with ``seed``); one output per invocation, in turn order."""
        if env_id not in gym.registry:
            raise ValueError(f"unknown environment {env_id!r}; registered memenv envs: "
                             + ", ".join(k for k in gym.registry if k.startswith("Mem")))
        env = gym.make(env_id, **dict(env_kwargs or {}))
        params = self.sampling_params(dict(sampling_params))
        request_id = uuid4().hex  # one sticky session per episode (prefix caching of the task block)
        outputs: list[InvocationOutput] = []
        try:
            observation, info = env.reset(seed=None if seed is None else int(seed))
            episode_id = str(info.get("episode_id", request_id))
            total = 0.0
            for turn in itertools.count(1):
                prompt_ids = self.format.encode_prompt(observation)
                reply = await self.server.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
                response_ids, logprobs = _token_ids(reply)
                text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
                # the env is CPU work (search, scoring): keep the event loop free for the other episodes
                observation, reward, terminated, truncated, info = await asyncio.to_thread(env.step, text)
                total += float(reward)
                outputs.append(InvocationOutput(
                    prompt_ids=list(prompt_ids), response_ids=response_ids, response_mask=[1] * len(response_ids),
                    response_logprobs=logprobs,
                    extra_fields={"episode_id": episode_id, "turn": turn, "step_reward": float(reward)}))
                if terminated or truncated:
                    break
            summary = {k: v for k, v in (info.get("summary") or {}).items() if k != "snapshots"}
            for out in outputs:  # every output carries the episode's return (GRPO reads the last one)
                out.reward_score = total
                out.extra_fields.update(episode_return=total, episode_turns=len(outputs),
                                        f1=float(summary.get("f1", total)))
            return outputs
        finally:
            env.close()


def sample_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``env_id`` / ``seed`` / ``env_kwargs`` of a verl sample: top-level fields, or inside ``extra_info``."""
    extra = kwargs.get("extra_info") or {}
    out = {name: kwargs.get(name, extra.get(name)) for name in SAMPLE_FIELDS}
    if out["env_id"] is None:
        out["env_id"] = "MemQA-v0"
    if out["seed"] is None:
        raise ValueError("memenv agent loop: the sample has no 'seed' (put env_id, seed and env_kwargs in "
                         "extra_info; see memenv_verl_dataset())")
    return out


def memenv_verl_dataset(env_id: str, num_tasks: int, seed: int = 0, env_kwargs: dict[str, Any] | None = None):
    """The rows of a verl parquet dataset for :data:`AGENT_NAME` (``pandas.DataFrame``; write with ``to_parquet``).

    ``prompt`` is a placeholder chat (verl's dataset loader wants one; the loop builds its own prompts from the
    env), ``agent_name`` routes the row to this loop, ``extra_info`` carries the task."""
    import pandas as pd

    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    rows = [{"data_source": f"memenv/{env_id}", "agent_name": AGENT_NAME,
             "prompt": [{"role": "user", "content": f"{env_id} seed={s}"}],
             "reward_model": {"style": "rule", "ground_truth": ""},
             "extra_info": {"env_id": env_id, "seed": s, "env_kwargs": dict(env_kwargs or {})}}
            for s in range(seed, seed + num_tasks)]
    return pd.DataFrame(rows)


try:  # the verl subclass exists only where verl is installed (GPU clusters; it pins transformers<5.11)
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
except Exception:  # noqa: BLE001 - any import failure means "no verl here"
    AgentLoopBase = None

if AgentLoopBase is not None:  # pragma: no cover - needs verl

    @register(AGENT_NAME)
    class MemenvAgentLoop(AgentLoopBase):
        """verl agent loop ``memenv_agent``: one ``AgentLoopOutput`` per memenv invocation (see module doc)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            rollout = self.config.actor_rollout_ref.rollout
            options = dict(getattr(rollout, "custom", None) or {}).get("memenv", {}) or {}
            self.loop = MemenvEpisodeLoop(self.server_manager, self.tokenizer,
                                          response_length=int(rollout.response_length),
                                          template=options.get("template", "auto"),
                                          system_prompt=options.get("system_prompt", "checkpoint"),
                                          max_prompt_tokens=int(rollout.prompt_length))

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
            outputs = await self.loop.run(sampling_params, **sample_kwargs(kwargs))
            return [AgentLoopOutput(prompt_ids=o.prompt_ids, response_ids=o.response_ids,
                                    response_mask=o.response_mask, response_logprobs=o.response_logprobs,
                                    reward_score=o.reward_score, num_turns=o.num_turns, metrics=AgentLoopMetrics(),
                                    extra_fields=o.extra_fields) for o in outputs]
