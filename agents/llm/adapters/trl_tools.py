"""TRL ``environment_factory`` for memenv's memory-tools mode: the memory tools as the model's tool calls.

``trl.GRPOTrainer(environment_factory=MemQAToolEnv)`` (trl >= 1.16, transformers >= 5.2) makes one instance per
rollout, exposes its public methods as tools through the chat template's tool calling (their names, type hints and
Google-style docstrings become the JSON schemas), calls ``reset(**row)`` before generation (the string it returns
is appended to the last user message) and, after the rollout, ``get_reward()``. The model's tool calls and the
tool results form **one growing transcript**; each call is one env step, with the same snapshot as the equivalent
action text in-process (``<mem_add>…</mem_add>``, ``<search>…</search>``, ``<answer>…</answer>``).

- :class:`MemQAToolEnv`: MemQA with ``memory_mode="tools"``: ``mem_add``, ``mem_update``, ``mem_delete``,
  ``mem_search``, ``search``, ``answer``; reward: the summary's ``f1`` (mean F1 over the objectives).
- :class:`BeamToolEnv`: MemDialog-BEAM (tools mode, its default): ``mem_add``, ``mem_update``, ``mem_delete``,
  ``mem_search``, ``next_session``, ``answer``; reward: the summary's ``score`` (BEAM's rubric score, or its
  judge-free approximation).
- :class:`LongMemEvalToolEnv`: MemDialog-LongMemEval (``data_path=`` the official file), the same tools and reward.

Each class takes the env's kwargs (``MemQAToolEnv(objectives=1)``); give TRL a callable of no arguments:
``environment_factory=functools.partial(MemQAToolEnv, objectives=1)``. ``url=`` plays the env on a memenv OpenEnv
server instead (``memenv serve``; :func:`memenv.openenv.connect`), one session per instance.

What a tool returns is what the env shows next, without the task block (already in the first message): the
memory block (the store's size, or its entries with ``show_store``) and the newest ``<information>`` (the call's
result, the turns left, a notice after an invalid call). A call that the env refuses (an unknown id, an empty
text) is an invalid step there and its message comes back as the result, as in-process. Once the episode is over
(an answer, the turn limit) a further call raises, which TRL shows the model as ``{"error": ...}`` and counts in
``tools/failure_frequency``; so does a call before ``reset()``, and a text argument that is no text (``null``, an
object: :func:`tool_text`; a list is joined, answers ``"; "``-separated, one per objective), with no step taken.
A rollout that never answers gets reward 0. ``url=`` refuses a server whose env is not the class's (another id,
or the same id in another memory mode, whose every tool call would be an invalid step).

Rows: a dataset column ``seed`` (:func:`tool_dataset`) makes ``reset`` deterministic per task; without it each
reset draws the next episode from the env's generator.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import memenv  # noqa: F401 - registers the environments
from memenv.memory_tools import format_tool_call
from tasks.types import answer_text

__all__ = ["BeamToolEnv", "LongMemEvalToolEnv", "MemQAToolEnv", "MemenvToolEnv", "tool_dataset", "DEFAULT_PREAMBLE"]

#: Put before the first observation: the observation names the tools by the tags of the text protocol.
DEFAULT_PREAMBLE = ("Use the tools you are given, one call at a time. The text below names them by their tags: "
                    "<search>, <mem_add>, <mem_update>, <mem_delete>, <mem_search>, <next/> and <answer> are the "
                    "tools search, mem_add, mem_update, mem_delete, mem_search, next_session and answer.\n\n")


class MemenvToolEnv:
    """Base class of the environment_factory envs (subclasses define the tool methods).

    Args:
        url: a memenv OpenEnv server (``memenv serve ENV_ID``) to play on instead of an in-process env; the
            server's env and kwargs are used (``env_kwargs`` must then be empty).
        preamble: text put before the first observation (default :data:`DEFAULT_PREAMBLE`).
        **env_kwargs: the env's kwargs (``gym.make(env_id, **defaults, **env_kwargs)``).

    After a rollout: ``info`` is the last step's info (``info["summary"]`` at the end), ``snapshots`` every
    step's ``info["invocation"]``, ``done`` whether the episode ended, ``reward`` the env's reward of the last step.
    """

    env_id = ""
    defaults: dict[str, Any] = {}
    reward_key = "f1"

    def __init__(self, *, url: str | None = None, preamble: str | None = None, **env_kwargs: Any) -> None:
        self.preamble = DEFAULT_PREAMBLE if preamble is None else str(preamble)
        if url is not None:
            if env_kwargs:
                raise ValueError(f"{type(self).__name__}(url=...) plays the server's env: its kwargs are set by "
                                 f"`memenv serve`, not here (got {sorted(env_kwargs)})")
            from memenv.openenv import connect

            self.env = connect(url)
            mismatch = self._served_mismatch()
            if mismatch is not None:
                served = self.env.env_id + (f" with {_kwargs_text(self.env.env_kwargs)}" if self.env.env_kwargs else "")
                self.env.close()
                raise ValueError(f"{type(self).__name__} needs a {self.env_id} server{mismatch}; {url} serves {served}")
        else:
            self.env = gym.make(self.env_id, **{**self.defaults, **env_kwargs})
        self.started = False  # no reset yet: a tool call says so (not "the episode is over")
        self.done = True
        self.info: dict[str, Any] = {}
        self.snapshots: list[dict[str, Any]] = []
        self.reward = 0.0
        self._task = ""

    # ------------------------------------------------------------------ TRL's protocol
    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Start an episode (``seed`` from the dataset row, if it has one) and return its first observation."""
        obs, info = self.env.reset(seed=seed)
        self.started, self.done, self.info, self.snapshots, self.reward = True, False, info, [], 0.0
        self._task = _task_block(obs)
        return self.preamble + obs

    def get_reward(self) -> float:
        """The episode's score from ``info["summary"]`` (``reward_key``); 0.0 if it never ended."""
        summary = self.info.get("summary") if self.done else None
        return float(summary[self.reward_key]) if summary else 0.0

    # ------------------------------------------------------------------ helpers (private: not tools)
    def _served_mismatch(self) -> str | None:
        """What the connected server's env lacks of this class's (``env_id`` and ``defaults``): ``None`` when it
        is the env this class plays, else the settings it needs (``" with memory_mode='tools'"``, or ``""`` for
        another env id). A setting the server was not given is the env's own default (its registration's, else
        its constructor's), so a MemQA server without ``memory_mode=`` is a rewrite-mode one, which no tool call
        of this class could play."""
        if self.env.env_id.split(":")[-1] != self.env_id:
            return ""
        served = env_settings(self.env_id, self.env.env_kwargs)
        needed = {key: value for key, value in self.defaults.items() if served.get(key) != value}
        return f" with {_kwargs_text(needed)}" if needed else None

    def _act(self, action: str) -> str:
        if not self.started:
            raise RuntimeError(f"no episode yet: call reset() before any tool call of {type(self).__name__}")
        if self.done:
            raise RuntimeError("the episode is over: no more tool calls")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.info, self.reward = info, float(reward)
        self.snapshots.append(info["invocation"])
        if terminated or truncated:
            self.done = True
            how = "answered" if terminated else "out of turns"
            return f"Episode over ({how}). {self._result(info['invocation'])}".strip()
        return obs[len(self._task):].lstrip("\n") if self._task and obs.startswith(self._task) else obs

    @staticmethod
    def _result(invocation: dict[str, Any]) -> str:
        if not invocation.get("valid", True):
            return f"Invalid call: {invocation.get('error')}"
        return str(invocation.get("tool_output") or "")

    def _store_call(self, name: str, text: Any = "", entry_id: Any = None) -> str:
        return self._act(format_tool_call(name, tool_text(name, text, self._list_separator(name)), entry_id))

    def _list_separator(self, name: str) -> str:
        """How a list given to tool ``name`` is joined into its text (one line per item; an answer per
        objective is ``"; "``-separated, see :class:`MemQAToolEnv`)."""
        return "\n"


def tool_text(name: str, value: Any, separator: str = "\n") -> str:
    """The text argument of a tool call as the action text carries it (the model's tool-call arguments are JSON,
    whatever type the schema names): a string as is, a number as an answer is written (``3.0`` -> ``"3"``,
    :func:`tasks.types.answer_text`), a list as its items' texts joined by ``separator``. ``None`` and any
    other type are refused (a ``ValueError`` naming the tool, which TRL shows the model as the call's error),
    never stored or sent as their repr (``"None"``, ``"['a', 'b']"``)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    texts = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            continue
        try:
            if item is None:  # answer_text's "no answer" ("") is no text to send either
                raise TypeError
            texts.append(answer_text(item))
        except (TypeError, ValueError):
            what = "null" if item is None else type(item).__name__
            raise ValueError(f"{name}: its text must be a string (or a list of strings), got {what}"
                             + (" in a list" if item is not value else "")) from None
    return separator.join(texts)


def env_settings(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The setting of every keyword argument of ``gym.make(env_id, **kwargs)``: ``kwargs``, else the id's
    registered kwargs, else the env constructor's defaults."""
    spec = gym.spec(env_id)
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    defaults = {name: p.default for name, p in inspect.signature(creator).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **spec.kwargs, **kwargs}


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in sorted(kwargs.items()))


def _task_block(obs: str) -> str:
    end = obs.find("</task>")
    return obs[:end + len("</task>")] if obs.startswith("<task>") and end >= 0 else ""


class _MemoryStoreTools(MemenvToolEnv):
    """The memory-store tools every tools-mode env shares (``mem_add`` is each env's own: its docstring says what
    to keep there)."""

    def mem_update(self, entry_id: int, text: str) -> str:
        """Replace the text of an entry of your memory store (e.g. a fact that changed).

        Args:
            entry_id: the id of the entry to replace.
            text: its new text.

        Returns:
            Whether the entry was updated.
        """
        return self._store_call("mem_update", text, entry_id)

    def mem_delete(self, entry_id: int) -> str:
        """Delete an entry of your memory store.

        Args:
            entry_id: the id of the entry to delete.

        Returns:
            Whether the entry was deleted.
        """
        return self._store_call("mem_delete", "", entry_id)

    def mem_search(self, query: str) -> str:
        """Search your memory store.

        Args:
            query: words to look for in your entries.

        Returns:
            The best matching entries as "[id] text" lines.
        """
        return self._store_call("mem_search", query)


class MemQAToolEnv(_MemoryStoreTools):
    """MemQA in memory-tools mode (``gym.make("MemQA-v0", memory_mode="tools", ...)``) as TRL tools."""

    env_id = "MemQA-v0"
    defaults = {"memory_mode": "tools"}
    reward_key = "f1"

    def _list_separator(self, name: str) -> str:
        return "; " if name == "answer" else "\n"  # a list of answers: one per objective, in order

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: what to look for, e.g. an entity name from a question.

        Returns:
            The best matching documents, with what your memory shows now.
        """
        return self._store_call("search", query)

    def mem_add(self, text: str) -> str:
        """Add an entry to your memory store (all you keep from earlier turns besides the newest result).

        Args:
            text: the note to keep, e.g. a fact a question needs.

        Returns:
            The new entry's id and size.
        """
        return self._store_call("mem_add", text)

    def answer(self, answers: str) -> str:
        """Answer the questions and end the episode.

        Args:
            answers: one answer per question, in order, separated by "; " (a list of answers is joined so).

        Returns:
            The end of the episode.
        """
        return self._store_call("answer", answers)


class BeamToolEnv(_MemoryStoreTools):
    """MemDialog-BEAM in memory-tools mode (its default) as TRL tools: read sessions into the store, then answer
    the probing questions from it."""

    env_id = "MemDialog-BEAM-v0"
    defaults = {"memory_mode": "tools"}
    reward_key = "score"

    def mem_add(self, text: str) -> str:
        """Add an entry to your memory store.

        Args:
            text: the note to keep, e.g. a fact the user stated, with its date.

        Returns:
            The new entry's id and size.
        """
        return self._store_call("mem_add", text)

    def next_session(self) -> str:
        """Done with this chat session: show the next one (or the first question after the last session).

        Returns:
            The next session's messages, or the first question.
        """
        return self._store_call("next")

    def answer(self, answer: str) -> str:
        """Answer the question shown.

        Args:
            answer: your answer.

        Returns:
            The next question, or the end of the episode.
        """
        return self._store_call("answer", answer)


class LongMemEvalToolEnv(BeamToolEnv):
    """MemDialog-LongMemEval in memory-tools mode as TRL tools: the same tools as :class:`BeamToolEnv` over one
    LongMemEval item per episode (its haystack sessions streamed, then its question); ``data_path=`` names the
    official file (oracle, S or M). Reward: the summary's ``score``."""

    env_id = "MemDialog-LongMemEval-v0"


def tool_dataset(num_tasks: int, seed: int = 0, prompt: str = ""):
    """A ``datasets.Dataset`` for ``GRPOTrainer(environment_factory=...)``: ``num_tasks`` rows with task seeds
    ``seed..seed+num_tasks-1`` (column ``seed``, passed to ``reset``) and a conversational ``prompt`` (one user
    message, ``prompt`` then the observation ``reset`` returns)."""
    if not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks < 1:
        raise ValueError(f"num_tasks must be an int >= 1, got {num_tasks!r}")
    from datasets import Dataset

    seeds = list(range(int(seed), int(seed) + num_tasks))
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": prompt}] for _ in seeds], "seed": seeds})
