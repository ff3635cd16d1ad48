"""What travels on the wire, and the checks of what comes in: a WebSocket message parsed into ``(type, data)``, a
step's action, OpenEnv's error and observation messages, JSON-RPC replies, and :class:`RequestError` (a request the
server refuses, one line naming the field)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from openenv.core.env_server import Action, Observation
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from pydantic import ValidationError

from memenv.openenv.types import MemenvAction


class RequestError(ValueError):
    """A request the server refuses (a bad field, a step before a reset): one line naming the field, answered
    as an OpenEnv error message (HTTP: status 400); the session and its env are as they were."""

    def __init__(self, message: str, code: str = "VALIDATION_ERROR", status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


_MESSAGE_TYPES = ("reset", "step", "state", "mcp", "close")
_MESSAGE_SHAPE = "message must be a JSON object with a 'type' field (reset, step, state, mcp or close)"
_MCP_ACTIONS = ("call_tool", "list_tools")


def parse_message(message: dict) -> tuple[str, dict]:
    """``(type, data)`` of one WebSocket frame, or :class:`RequestError` naming what is wrong with it."""
    text = message.get("text")
    if text is None:
        raise RequestError(f"binary frames are not accepted: {_MESSAGE_SHAPE}, sent as a text frame")
    try:
        request = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"message is not JSON ({exc.msg} at character {exc.pos}): {_MESSAGE_SHAPE}",
                           "INVALID_JSON") from None
    if not isinstance(request, dict) or "type" not in request:
        raise RequestError(f"{_MESSAGE_SHAPE}, got {json_kind(request)}")
    kind = request["type"]
    if kind not in _MESSAGE_TYPES:
        raise RequestError(f"unknown message type {kind!r}: expected one of {', '.join(_MESSAGE_TYPES)}",
                           "UNKNOWN_TYPE")
    unknown = sorted(set(request) - {"type", "data"})
    if unknown:
        raise RequestError(f"{kind}: unknown field(s) {unknown}: a message has 'type' and 'data'")
    data = request.get("data", {})
    if kind == "mcp":
        return kind, data  # a JSON-RPC request: SessionHub._rpc answers anything else with a JSON-RPC error
    if not isinstance(data, dict):
        raise RequestError(f"{kind}: 'data' must be a JSON object, got {json_kind(data)}")
    if kind == "step" and "text" not in data and data.get("type") not in _MCP_ACTIONS:
        raise RequestError("step: 'data' must have a 'text' field (the action text), e.g. {\"text\": \"...\"}")
    return kind, data


def parse_action(data: dict, tools: tuple[str, ...] = ()) -> Action:
    """The action of a ``step`` message: a :class:`MemenvAction` (``{"text": ...}``), or for an env with MCP
    tools OpenEnv's ``{"type": "call_tool", "tool_name", "arguments"}`` / ``{"type": "list_tools"}``."""
    if data.get("type") in _MCP_ACTIONS:
        if not tools:
            raise RequestError(f"this env has no MCP tools ({data['type']}): its actions are {{\"text\": ...}}; "
                               "serve it with --kw memory_mode=tools for tools")
        cls = CallToolAction if data["type"] == "call_tool" else ListToolsAction
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise RequestError(f"unknown field(s) {unknown} in 'data': a {data['type']} action has "
                               f"{', '.join(repr(f) for f in cls.model_fields if f != 'metadata')}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RequestError(first_error(exc.errors())) from None
    unknown = sorted(set(data) - set(MemenvAction.model_fields))
    if unknown:
        raise RequestError(f"unknown field(s) {unknown} in 'data': an action has 'text' (and 'metadata')")
    try:
        return MemenvAction(**data)
    except ValidationError as exc:
        raise RequestError(first_error(exc.errors())) from None


def first_error(errors: Any) -> str:
    """Pydantic's (or FastAPI's) list of validation errors as one line naming the first one's field."""
    first = dict(errors[0]) if errors else {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"{where or 'request body'}: {first.get('msg', 'invalid')}"


def json_kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def error_reply(message: str, code: str) -> Any:
    from openenv.core.env_server.types import WSErrorResponse

    return WSErrorResponse(data={"message": message, "code": code})

def wire_observation(observation: Observation) -> dict[str, Any]:
    """The ``data`` of OpenEnv's observation message: ``{"observation": {fields}, "reward", "done"}``. The fields
    leave out ``metadata``: openenv 0.10's ``serialize_observation`` sends it twice (inside the observation and
    beside it), and a :class:`MemenvObservation`'s metadata is its ``info``, which travels once, as ``info``."""
    fields = observation.model_dump(exclude={"reward", "done", "metadata"})
    return {"observation": fields, "reward": observation.reward, "done": observation.done}

def rpc_result(rid: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def rpc_error(rid: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def request_json_body(body: bytes) -> Any:
    """The JSON value of an HTTP request body, or a :class:`RequestError` of one line: not UTF-8 (JSON text is
    UTF-8; other bytes raised UnicodeDecodeError, a 500) or not JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not UTF-8 text (byte {exc.start}); send JSON as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON ({exc.msg} at character {exc.pos})") from None


@contextlib.contextmanager
def env_unavailable_as_503():
    """Turn a failure to make or reset the env that is not the request's fault (a data file the env reads, now
    damaged or gone: :class:`tasks.types.DataFormatError`, ``OSError``) into a :class:`RequestError` of status
    503 (one line)."""
    from tasks.types import DataFormatError

    try:
        yield
    except RequestError:
        raise
    except (DataFormatError, OSError) as exc:
        raise RequestError(f"the env cannot reset: {type(exc).__name__}: {exc}".splitlines()[0],
                                  "EXECUTION_ERROR", status=503) from exc
