"""Machinery every memenv environment shares: text spaces, the context window, snapshots and episode stats.

Subclasses implement the task (what the tools do, how answers are scored); this base keeps the observation
builder, the invocation snapshot of the info contract (docs/design.md) and the episode summary in one place.
"""

from __future__ import annotations

import copy
import functools
import os
import warnings
from typing import Any, Callable

import gymnasium as gym
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs
from gymnasium.utils.passive_env_checker import env_reset_passive_checker
from gymnasium.vector.utils import create_shared_memory
from gymnasium.wrappers import PassiveEnvChecker
from tasks.types import file_stamps  # noqa: F401 - the envs' loaders key their caches on it (lives with the tasks)

from memenv.context import CHARSET, ContextMode, TokenCounter, count_words, fit_context, sanitize, truncate_right
from memenv.validation import ArgumentTypeError, check_callable, check_choice, check_int, check_number, check_path

#: Tokens of body (memory and newest information) an observation always keeps next to the task block.
MIN_BODY_TOKENS = 16

def required_data_file(data_path: Any, env_id: str, what: str, example: str, label: str) -> str:
    """The path of a data file an env cannot run without; a clear error when it is missing or absent."""
    if data_path is None:
        raise ValueError(f"{env_id} needs data_path= ({what}), e.g. "
                         f"gym.make('{env_id}', data_path='{example}')")
    path = check_path("data_path", data_path, allow_none=False)
    if not os.path.isfile(path):
        what_is = "is a directory, not a file" if os.path.isdir(path) else "not found"
        raise FileNotFoundError(f"{label} data file {what_is}: data_path={path!r}")
    return path


def check_reset_args(seed: Any, options: Any) -> int | None:
    """The ``seed`` of a ``reset(seed=..., options=...)`` as an int >= 0 (or None); a clear error otherwise.

    Called before anything of the env changes, so a refused reset leaves the env (and the episode it was
    playing) exactly as it was. Gymnasium's own refusal (``seeding.np_random``) is an ``error.Error`` naming no
    parameter and rejects numpy integers that the checks here accept."""
    seed = check_int("seed", seed, minimum=0, allow_none=True)
    if options is not None and not isinstance(options, dict):
        raise ArgumentTypeError(f"options must be a dict or None, got {type(options).__name__}")
    return seed


class EnvChecker(PassiveEnvChecker, RecordConstructorArgs):
    """Gymnasium's passive env checker, except that a reset counts as checked only once one has returned.

    ``gymnasium.wrappers.PassiveEnvChecker`` marks its first reset as checked before calling it: when that reset
    raises (a refused seed, a data file gone), the checker keeps no reset result and every later ``step`` fails
    with ``cannot unpack non-iterable NoneType object``, for the life of the env. memenv registers its envs with
    this checker in place of Gymnasium's (``disable_env_checker=True`` plus this wrapper), so a refused reset
    never poisons the env. The seed is checked here as well (:func:`check_reset_args`), before any wrapper below
    sees it: an env made with ``disable_env_checker=False`` still gets Gymnasium's checker underneath.
    """

    # Gymnasium's checker reports itself in the spec as disable_env_checker=False; this one is a wrapper of the
    # spec's additional_wrappers, so gym.make(env.spec) rebuilds it (and not Gymnasium's too).
    spec = gym.Wrapper.spec

    def __init__(self, env: gym.Env) -> None:
        RecordConstructorArgs.__init__(self)
        PassiveEnvChecker.__init__(self, env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        seed = check_reset_args(seed, options)
        if self.checked_reset:
            return self.env.reset(seed=seed, options=options)
        result = env_reset_passive_checker(self.env, seed=seed, options=options)
        self.checked_reset, self._previous_data = True, result
        return result

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if not self.checked_reset:  # no reset has returned yet: the env refuses the step (OrderEnforcing below)
            return self.env.step(action)
        return super().step(action)


class MemText(spaces.Text):
    """Gymnasium's ``Text`` space with a repr that fits on a line.

    ``spaces.Text.__repr__`` lists the whole charset: 63k characters for :data:`CHARSET`. This one names the
    charset by its size and ends (``Text(0, 1000000, charset=<63,331 characters U+0009..U+FFFD>)``).
    Everything else (sampling, ``contains``, flattening, batching, pickling) is the parent's.
    """

    def __repr__(self) -> str:
        chars = self.character_list
        charset = f"<{len(chars):,} characters U+{ord(min(chars)):04X}..U+{ord(max(chars)):04X}>"
        return f"{type(self).__name__}({self.min_length}, {self.max_length}, charset={charset})"


SHARED_MEMORY_WARNING = (
    "AsyncVectorEnv(shared_memory=True) over memenv's Text observation space returns stale observations: "
    "Gymnasium 1.x reads Text observations out of shared memory once, when the vector env is built "
    "(Farama-Foundation/Gymnasium#1164). Build it with shared_memory=False, e.g. gym.make_vec(..., "
    "vectorization_mode='async', vector_kwargs={'shared_memory': False})."
)


@create_shared_memory.register(MemText)
def _create_text_shared_memory_with_warning(space: MemText, n: int = 1, ctx: Any = None) -> Any:
    """``AsyncVectorEnv(shared_memory=True)`` calls this (and nothing else does) while it is built: warn,
    then allocate the buffer as Gymnasium would for any ``Text`` space. The warning's location is fixed
    (Gymnasium's AsyncVectorEnv), so the default filter shows it once per process."""
    warnings.warn(SHARED_MEMORY_WARNING, RuntimeWarning, stacklevel=3)
    parent = create_shared_memory.dispatch(spaces.Text)
    return parent(space, n=n) if ctx is None else parent(space, n=n, ctx=ctx)


@functools.lru_cache(maxsize=None)
def _text_space_template(max_length: int, min_length: int) -> MemText:
    return MemText(max_length, min_length=min_length, charset=CHARSET)


def text_space(max_length: int, min_length: int = 0) -> MemText:
    """A :class:`MemText` space over :data:`CHARSET`.

    Building a Text space over ~63k characters takes ~40 ms, so spaces are shallow copies of one template
    (the charset tables are read-only); each copy gets its own sampling generator.
    """
    space = copy.copy(_text_space_template(max_length, min_length))
    space._np_random = None  # noqa: SLF001 - a fresh RNG per copy, seeded through Space.seed()
    return space


def _refusing_unknown_kwargs(owner: str, init: Callable) -> Callable:
    """``init`` that first refuses keywords its signature does not take (a TypeError: one line with the valid
    ones); an ``init`` taking ``**kwargs`` is returned as it is."""
    import difflib
    import inspect

    params = inspect.signature(init).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return init
    valid = [name for name, p in params.items() if name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]

    @functools.wraps(init)
    def checked(self, *args: Any, **kwargs: Any) -> None:
        unknown = [key for key in kwargs if key not in params]
        if unknown:
            close = difflib.get_close_matches(unknown[0], valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{owner}: unknown keyword argument(s) {', '.join(map(repr, unknown))}{hint}; valid "
                            f"kwargs: {', '.join(valid)}")
        init(self, *args, **kwargs)

    return checked


class MemEnvBase(gym.Env):
    """Base class: observation assembly under a context mode and budget, snapshots, episode summary.

    Subclasses call :meth:`_start_episode` in ``reset`` and :meth:`_record` in ``step``, and provide
    :meth:`_task_block`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each env's ``__init__`` refuses an unknown keyword (a misspelled env kwarg) in one line naming it, the
        closest valid one and every valid one, instead of Python's bare "unexpected keyword argument"."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:
            cls.__init__ = _refusing_unknown_kwargs(cls.__name__, init)

    def __init__(self, *, context: str = "memory", context_budget: int | None = None,
                 token_counter: TokenCounter | None = None, memory_budget: int | None = None,
                 invalid_penalty: float = 0.0, max_observation_chars: int = 1_000_000,
                 max_action_chars: int = 100_000, render_mode: str | None = None) -> None:
        self.render_mode = check_choice("render_mode", render_mode, self.metadata["render_modes"], allow_none=True)
        self.mode = ContextMode.parse(context)
        self.context_budget = check_int("context_budget", context_budget, minimum=1, allow_none=True)
        self.token_counter = check_callable("token_counter", token_counter, probe="a short probe text")
        self.count_tokens: TokenCounter = token_counter or count_words
        self.memory_budget = check_int("memory_budget", memory_budget, minimum=0, allow_none=True)
        self.invalid_penalty = check_number("invalid_penalty", invalid_penalty, minimum=0)
        self.max_observation_chars = check_int("max_observation_chars", max_observation_chars, minimum=1)
        self.observation_space = text_space(self.max_observation_chars)
        self.action_space = text_space(check_int("max_action_chars", max_action_chars, minimum=1))
        self._episode_id = ""
        self._turn = 0
        self._memory = ""
        self._snapshots: list[dict[str, Any]] = []
        self._snapshots_dropped = 0
        self._transcript: list[str] = []  # history/window modes: information blocks and actions, in order
        self._obs = ""
        self._obs_tokens = 0
        self._obs_truncated = 0
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Seed the env's generator (subclasses call this first): a bad ``seed`` is refused here, before any
        state of the env changes, so the episode in progress stays playable."""
        return super().reset(seed=check_reset_args(seed, options), options=options)

    # ------------------------------------------------------------------ to implement
    def _task_block(self) -> str:
        raise NotImplementedError

    def _check_context_budget(self, task_skeleton: str) -> None:
        """Refuse a ``context_budget`` that cannot hold the task block plus :data:`MIN_BODY_TOKENS` of body.

        ``task_skeleton`` is the task block with empty question texts (its fixed part: instructions and
        question headers), so the check is a lower bound known at make time. The task block is never cut
        (see :func:`memenv.context.fit_context`): with long questions an observation may still overflow the
        budget, which ``context_tokens`` reports.
        """
        if self.context_budget is None:
            return
        task_tokens = self.count_tokens(task_skeleton)
        need = task_tokens + MIN_BODY_TOKENS
        if self.context_budget < need:
            raise ValueError(
                f"context_budget={self.context_budget} cannot hold the task block ({task_tokens} tokens for its "
                f"instructions and question headers, before the question texts) plus {MIN_BODY_TOKENS} tokens of "
                f"memory and information: use context_budget >= {need}, or None for no budget")

    # ------------------------------------------------------------------ episode bookkeeping
    def _start_episode(self, first_information: str) -> None:
        self._episode_id = f"{int(self.np_random.integers(2**63)):016x}"
        self._turn = 0
        self._memory = ""
        self._snapshots = []
        self._snapshots_dropped = 0
        self._transcript = [first_information]
        self._information = first_information
        self._peak_tokens = 0
        self._total_tokens = 0
        self._invalid = 0
        self._done = False
        self._render_obs()

    def _begin_step(self) -> str:
        """Start a step: refuse a finished episode, use the turn; returns the memory before the action."""
        if self._done:
            raise RuntimeError("step() called on a finished episode: call reset() first")
        self._turn += 1
        return self._memory

    def _set_memory(self, memory: str) -> int:
        """Store a rewritten memory, enforcing ``memory_budget`` (keeps the start); returns tokens cut."""
        memory = sanitize(memory)
        dropped = 0
        if self.memory_budget is not None:
            # Keep the *start* of the memory: the writer decides what comes first.
            memory, dropped = truncate_right(memory, self.memory_budget, self.token_counter)
        self._memory = memory
        return dropped

    def _close_step(self, snapshot: dict[str, Any], information: str, action: Any, reward: float,
                    terminated: bool, truncated: bool, summary: Callable[[], dict[str, Any]]):
        """The common end of a step: forget kept snapshots unless ``keep_snapshots``, advance the observation,
        and return the step tuple whose info carries the invocation (and ``summary()`` once the episode ends)."""
        keep = getattr(self, "keep_snapshots", True)
        if keep is not True and len(self._snapshots) > int(keep):  # False (0): none kept; N: the last N
            extra = len(self._snapshots) - int(keep)
            del self._snapshots[:extra]
            self._snapshots_dropped += extra
        self._advance(information, action if isinstance(action, str) else repr(action))
        info: dict[str, Any] = {"invocation": snapshot}
        if terminated or truncated:
            self._done = True
            info["summary"] = summary()
        return self._obs, reward, terminated, truncated, info

    def _advance(self, information: str, action_text: str) -> None:
        """Append this turn to the transcript and build the next observation."""
        self._information = information
        if self.mode.keeps_transcript:
            self._transcript.append(sanitize(action_text))
            self._transcript.append(information)
        self._render_obs()

    def _render_obs(self) -> None:
        task = self._task_block()
        if self.mode.name == "memory":
            body = f"\n<memory>\n{self._memory}\n</memory>\n{self._information}"
        elif self.mode.name == "none":
            body = "\n" + self._information
        else:
            parts = self._transcript
            if self.mode.name == "window":
                parts = parts[-(2 * self.mode.window + 1):]  # K (action, information) pairs + one more block
            body = "\n" + "\n".join(parts)
        text, tokens, truncated = fit_context(task, body, self.context_budget, self.token_counter,
                                              min_body=MIN_BODY_TOKENS)
        if len(text) > self.max_observation_chars:  # hard cap of the Text space, far above real budgets
            keep = self.max_observation_chars - len(task) - 4
            text = task + "[…] " + text[-keep:] if keep > 0 else text[-self.max_observation_chars:]
            truncated += max(0, tokens - self.count_tokens(text))
            tokens = self.count_tokens(text)
        self._obs, self._obs_tokens, self._obs_truncated = text, tokens, truncated

    def _record(self, *, action: Any, memory_before: str, tool: str | None, tool_input: str | None,
                tool_output: str, valid: bool, error: str | None, reward: float, **extra: Any) -> dict[str, Any]:
        """The invocation snapshot (docs/design.md, "The info contract") for the observation just acted on.

        Every step of an env returns the same keys with the same types (vector envs batch a key per step, and
        an int array cannot take a None): ``retrieved_ids`` is ``[]`` when the step retrieved nothing,
        ``answer_f1``/``answer_em`` are ``[]`` when it scored no answer; ``extra`` holds the env's own keys,
        which it passes on every step.
        """
        snapshot = {
            "episode_id": self._episode_id,
            "turn": self._turn,
            "observation": self._obs,
            "memory_before": memory_before,
            "action": action if isinstance(action, str) else repr(action),
            "memory_after": self._memory,
            "tool": tool,
            "tool_input": tool_input,
            "tool_output": tool_output,
            "valid": valid,
            "error": error,
            "context_tokens": self._obs_tokens,
            "truncated_tokens": self._obs_truncated,
            "reward": float(reward),
            "retrieved_ids": [],
            "answer_f1": [],
            "answer_em": [],
            **extra,
        }
        self._snapshots.append(snapshot)
        self._peak_tokens = max(self._peak_tokens, self._obs_tokens)
        self._total_tokens += self._obs_tokens
        if not valid:
            self._invalid += 1
        return snapshot

    def _episode_stats(self) -> dict[str, Any]:
        return {
            "episode_id": self._episode_id,
            "turns": self._turn,
            "peak_context_tokens": self._peak_tokens,
            "total_context_tokens": self._total_tokens,
            "invalid_actions": self._invalid,
            "invalid_rate": self._invalid / max(1, self._turn),
            "snapshots": list(self._snapshots),
            "snapshots_dropped": self._snapshots_dropped,  # the earliest ones, beyond keep_snapshots
        }

    def _episode_info(self, em: list[float], f1: list[float], answers: list[str], answered: bool,
                         **extra: Any) -> dict[str, Any]:
        """``info["summary"]`` (docs/design.md): scores per objective, their sum and mean, and the episode stats.

        ``self.questions`` (the episode's :class:`tasks.Question` list) gives the gold answers.
        """
        n = max(1, len(self.questions))
        return {
            **self._episode_stats(),
            "f1": float(sum(f1)) / n, "em": float(sum(em)) / n,
            "f1_sum": float(sum(f1)), "em_sum": float(sum(em)),
            "f1_mean": float(sum(f1)) / n, "em_mean": float(sum(em)) / n,
            "f1_per_objective": list(f1), "em_per_objective": list(em),
            "answers": list(answers),
            "gold": [list(q.answers) for q in self.questions],
            "questions": [q.question for q in self.questions],
            "answered": answered,
            **extra,
        }

    # ------------------------------------------------------------------ gymnasium API
    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        header = f"=== episode {self._episode_id} | turn {self._turn} | {self._obs_tokens} context tokens ==="
        lines = [header, self._obs]
        if self._snapshots:
            last = self._snapshots[-1]
            lines.append(f"--- last action (turn {last['turn']}, {'valid' if last['valid'] else 'INVALID: ' + str(last['error'])}) ---")
            lines.append(last["action"])
        return "\n".join(lines) + "\n"
