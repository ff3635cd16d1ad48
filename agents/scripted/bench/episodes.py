"""Running episodes: one episode (:func:`run_episode`), and :class:`EpisodeRunner`, which turns a service failure
into a failed episode and stops the run past ``max_failures`` of them or on Ctrl-C."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import gymnasium as gym

import agents.llm.adapters.served
import memenv.scoring.judges
import memenv.search.http
import memenv.search.remote
from agents.scripted.strategies.user_strategies import StrategyError
from agents.llm.adapters.served import ServerError
from memenv.cli_common import CommandError


def _errors_defined_in(*modules) -> tuple[type[BaseException], ...]:
    """Every exception class defined in ``modules`` (so that one added there is caught as well)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == module.__name__:
                found.append(value)
    return tuple(dict.fromkeys(found))


#: What a failed request to a served model, a retrieval server or a judge raises during an episode: such an
#: episode counts as failed instead of ending the run. Anything else is a bug and keeps its traceback.
_SERVICE_BASE = getattr(memenv.search.http, "ServiceError", None)  # the base of every service failure
SERVICE_ERRORS = tuple(dict.fromkeys(
    ((_SERVICE_BASE,) if _SERVICE_BASE is not None
     else _errors_defined_in(memenv.search.http, agents.llm.adapters.served))
    + (ServerError, memenv.search.remote.RetrieverError, memenv.scoring.judges.JudgeError, StrategyError)))

class Stopped(Exception):
    """An episode abandoned because the run is stopping (Ctrl-C, or too many failed episodes)."""


def run_episode(env: gym.Env, policy, seed: int, stop: threading.Event | None = None) -> tuple[dict[str, Any], int]:
    """One episode of ``policy`` on ``env``; returns ``info["summary"]`` and the number of steps. When ``stop``
    is set between two steps the episode is abandoned (:class:`Stopped`)."""
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    steps = 0
    while True:
        if stop is not None and stop.is_set():
            raise Stopped
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        steps += 1
        if terminated or truncated:
            return info["summary"], steps

class TooManyFailures(CommandError):
    """More than ``max_failures`` episodes failed on a service: the run stopped (exit status 1)."""

    def __init__(self, message: str, failures: list[str]) -> None:
        super().__init__(message, status=1)
        self.failures = failures


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# The keys of an episode that did not finish.
EPISODE_STOPPED, EPISODE_FAILED = "memenv_bench_stopped", "memenv_bench_failed"


class EpisodeRunner:
    """Runs episodes for :func:`run_bench`: a service failure becomes a failed episode; past ``max_failures``
    of them, or on Ctrl-C (``stop``), the episodes not yet finished are abandoned."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    @property
    def too_many(self) -> bool:
        return len(self.failures) > self.max_failures

    def __call__(self, env: gym.Env, policy, seed: int) -> tuple[dict[str, Any], int]:
        try:
            return run_episode(env, policy, seed, self.stop)
        except Stopped:
            return {EPISODE_STOPPED: True}, 0
        except SERVICE_ERRORS as err:
            message = one_line(err)
            with self.lock:
                self.failures.append(message)
                if self.too_many:
                    self.stop.set()
            return {EPISODE_FAILED: message}, 0


@contextmanager
def interrupt_sets(event: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C also sets ``event`` (before its KeyboardInterrupt), so that episodes running on
    worker threads stop at their next step instead of running to their end."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def handler(signum, frame):
        event.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
