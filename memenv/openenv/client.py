"""The client side: :class:`MemenvClient` (the typed OpenEnv client of a memenv server) and :class:`ServedEnv`
(one session as a Gymnasium-like env, :func:`connect`), which turns a session that ended under it into one
:class:`SessionEndedError`."""

from __future__ import annotations

import json
import re
from typing import Any

import gymnasium as gym
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from memenv.envs.base import check_reset_args, text_space
from memenv.openenv.types import MemenvAction, MemenvObservation, MemenvState


class MemenvClient(EnvClient[MemenvAction, MemenvObservation, MemenvState]):
    """The typed OpenEnv client of a memenv server (async; ``.sync()`` for blocking calls)."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        text = action.text if isinstance(action, MemenvAction) else action
        try:
            json.dumps(text)
        except (TypeError, ValueError):
            text = repr(text)  # not JSON: the env sees its repr (an invalid step either way)
        return {"text": text}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MemenvObservation]:
        fields = dict(payload.get("observation", {}))
        fields.pop("metadata", None)  # the same dict as info (memenv's server leaves it out; others may not)
        observation = MemenvObservation(**fields, reward=payload.get("reward"), done=bool(payload.get("done")),
                                        metadata=fields.get("info", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done")))

    def _parse_state(self, payload: dict[str, Any]) -> MemenvState:
        return MemenvState(**payload)


async def _close_session(client: EnvClient, timeout_s: float = 5.0) -> None:
    import asyncio

    ws = client._ws
    await ws.send(json.dumps({"type": "close"}))
    await asyncio.wait_for(ws.wait_closed(), timeout_s)
    client._ws = None


class SessionEndedError(ConnectionError):
    """The session is over: the server closed it (the close frame's reason says why: idle too long, full, shut
    down) or the connection is gone (the server stopped, the network dropped). Connect again to play on."""


_CLOSE_MEANINGS = {1001: "the server is going away", 1006: "the connection dropped without a close frame",
                   1012: "the server shut down (or is restarting)"}


def _session_ended(url: str, frame: Any) -> SessionEndedError:
    """One line for a session that ended under the client, naming the URL and the server's reason (``frame``:
    the close frame the server sent, websockets' ``Close``; None when it sent none)."""
    if frame is not None:
        why = frame.reason or _CLOSE_MEANINGS.get(frame.code, "no reason given")
        why = f"the server closed it: {why} (close code {frame.code})"
    else:
        why = "the connection was lost (the server stopped or the network dropped)"
    return SessionEndedError(f"the OpenEnv session at {url} has ended: {why}; connect again to play on")


class ServedEnv(gym.Env):
    """A memenv env served over OpenEnv, used like the in-process one (one session = one env instance).

    ``reset(seed=None, options=None) -> (obs, info)``; ``step(action) -> (obs, reward, terminated, truncated,
    info)``; ``state()`` the server's :class:`MemenvState`; ``close()`` ends the session. The info dicts are the
    in-process ones passed through JSON (tuples come back as lists).
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, message_timeout_s: float = 600.0) -> None:
        self.url = url
        self._ended: SessionEndedError | None = None
        self.client = MemenvClient(base_url=url, connect_timeout_s=connect_timeout_s,
                                   message_timeout_s=message_timeout_s).sync()
        try:
            self.client.connect()
        except ConnectionError as exc:  # nothing listens there (refused, unknown host, timed out)
            self.client.close()
            raise ConnectionError(f"cannot reach the OpenEnv server at {url}: {exc.__cause__ or exc}") from None
        from websockets.exceptions import ConnectionClosed

        try:
            state = self.client.state()
        except (RuntimeError, ConnectionClosed) as exc:  # the server refused the session (it is full)
            self.client.close()
            frame = getattr(exc, "rcvd", None)
            reason = (frame.reason if frame is not None and frame.reason
                      else re.sub(r" \(code: \w+\)$", "", str(exc).removeprefix("Server error: ")))
            raise RuntimeError(f"the OpenEnv server at {url} refused the session: {reason}") from None
        self.env_id, self.env_kwargs = state.env_id, state.env_kwargs
        self.observation_space = text_space(state.max_observation_chars)
        self.action_space = text_space(state.max_action_chars)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        kwargs: dict[str, Any] = {}
        seed = check_reset_args(seed, options)  # the env's own check, before anything is sent (int(1.5) was 1)
        if seed is not None:
            kwargs["seed"] = seed
        if options is not None:
            kwargs["options"] = options
        result = self._call(self.client.reset, **kwargs)
        return result.observation.text, result.observation.info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        obs = self._call(self.client.step, MemenvAction(text=action)).observation
        return obs.text, float(obs.reward or 0.0), obs.terminated, obs.truncated, obs.info

    def state(self) -> MemenvState:
        return self._call(self.client.state)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of the client; a session that ended under it is one
        :class:`SessionEndedError` naming the URL and why, on this call and every later one."""
        from websockets.exceptions import ConnectionClosed
        from websockets.protocol import State as SocketState

        if self._ended is not None:
            raise self._ended
        # openenv 0.10's client reconnects on its own when its socket is closed: that would be a new session on
        # the server, without this one's episode (its next step refused, "step before reset"). A session that
        # ended is over: say so, as when the call itself finds the socket closed.
        ws = self.client.async_client._ws
        if ws is None or ws.state in (SocketState.CLOSING, SocketState.CLOSED):
            self._ended = _session_ended(self.url, getattr(getattr(ws, "protocol", None), "close_rcvd", None))
            raise self._ended
        try:
            result = method(*args, **kwargs)
        except (ConnectionClosed, ConnectionError) as exc:
            # websockets' ConnectionClosed carries the close frame the server sent, if any
            self._ended = _session_ended(self.url, getattr(exc, "rcvd", None))
            raise self._ended from None
        except RuntimeError:  # an error frame: of this session, or of a new one opened under the call (below)
            self._reconnected_under(ws)
            raise
        self._reconnected_under(ws)
        return result

    def _reconnected_under(self, ws: Any) -> None:
        """Raise :class:`SessionEndedError` where the client's socket is no longer ``ws``: the close frame reached
        the client's loop between the check above and the call's send (a loaded machine), so openenv reconnected
        to a new server session, which has not this one's episode ("step before reset"). That new session is
        closed; this one is over, as if the check had seen its close."""
        if self.client.async_client._ws is ws:
            return
        self._ended = _session_ended(self.url, getattr(getattr(ws, "protocol", None), "close_rcvd", None))
        self.close()
        raise self._ended from None

    def close(self) -> None:
        """End the session: ask the server to close it and wait for its close frame (closing the socket first
        would make the server's own close fail with a logged ``WebSocketDisconnect``)."""
        if getattr(self.client, "_loop", None) is not None and self.client.async_client._ws is not None:
            try:
                self.client._run(_close_session(self.client.async_client))
            except Exception:  # noqa: BLE001 - best effort: the socket is closed below either way
                pass
        self.client.close()

    def __repr__(self) -> str:
        return f"ServedEnv({self.env_id!r} at {self.url})"


def connect(url: str, **kwargs: Any) -> ServedEnv:
    """A :class:`ServedEnv` session on the memenv OpenEnv server at ``url`` (``http://host:port``)."""
    return ServedEnv(url, **kwargs)
