"""memory-tools mode as MCP tools (memenv.openenv.MemenvToolsEnvironment, openenv 0.10's MCPEnvironment): the
tools are listed with JSON schemas, and calling them, in-process, over the /ws session (OpenEnv's ``mcp``
messages and ``call_tool`` steps) or with OpenEnv's own MCPToolClient (POST /mcp sessions), gives the in-process
tools-mode episode step for step; refused calls are one line naming the argument; /mcp sessions are counted
and reaped like the others.

Every server binds 127.0.0.1 on a free port. Skips when openenv is absent (pip install 'memenv[openenv]').
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

pytest.importorskip("openenv.core.env_server.mcp_environment", reason="openenv not installed: pip install 'memenv[openenv]'")

import memenv  # noqa: E402,F401
from agents.scripted import make_strategy  # noqa: E402
from memenv.memory_tools import format_tool_call, parse_tool_call  # noqa: E402
from memenv.openenv import BackgroundServer, MemenvToolsEnvironment, jsonable  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction  # noqa: E402

# (env id, kwargs, the tools it offers)
CASES = {
    "memqa": ("MemQA-v0", {"memory_mode": "tools", "max_turns": 12, "objectives": 2},
              {"mem_add", "mem_update", "mem_delete", "mem_search", "search", "answer"}),
    "beam": ("MemDialog-BEAM-v0", {"chat_tokens": 4000, "max_tool_calls": 4},
             {"mem_add", "mem_update", "mem_delete", "mem_search", "next", "answer", "strategy"}),
}
ARGUMENT = {"mem_add": "text", "answer": "text", "strategy": "text", "mem_search": "query", "search": "query"}


def tool_call(action: str) -> tuple[str, dict]:
    """The MCP call equal to one action text of the tools protocol."""
    call = parse_tool_call(action)
    assert call.valid, (action, call.error)
    if call.name == "mem_update":
        return call.name, {"id": call.entry_id, "text": call.argument}
    if call.name == "mem_delete":
        return call.name, {"id": call.entry_id}
    if call.name == "next":
        return call.name, {}
    return call.name, {ARGUMENT[call.name]: call.argument}


def local_episode(env_id, kwargs, seed):
    """The in-process tools-mode episode of the ``rag`` strategy: (tool, arguments, step dict) per step."""
    env = gym.make(env_id, **kwargs)
    strategy = make_strategy("rag", env_id, "tools")
    obs, info = env.reset(seed=seed)
    strategy.reset(None)
    steps = []
    while True:
        # The call's canonical text (format_tool_call), which is what a tool call plays: the strategy's own text
        # may differ in the whitespace inside the tags, which the invocation's `action` records verbatim.
        call = parse_tool_call(strategy.act(obs))
        action = format_tool_call(call.name, call.argument, call.entry_id)
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((*tool_call(action), json.loads(json.dumps(jsonable(
            {"text": obs, "reward": float(reward), "terminated": terminated, "truncated": truncated, "info": info})))))
        if terminated or truncated:
            return steps


def assert_schemas(tools, names):
    assert {t["name"] if isinstance(t, dict) else t.name for t in tools} == names
    for tool in tools:
        tool = tool if isinstance(tool, dict) else tool.model_dump()
        schema = tool["input_schema"] if "input_schema" in tool else tool["inputSchema"]
        assert schema["type"] == "object" and tool["description"]
        expected = {"mem_update": {"id", "text"}, "mem_delete": {"id"}, "next": set()}.get(
            tool["name"], {ARGUMENT.get(tool["name"])})
        assert set(schema.get("properties", {})) == expected and set(schema.get("required", [])) == expected
        if "id" in expected:
            assert schema["properties"]["id"]["type"] == "integer"


@pytest.mark.parametrize("case", list(CASES))
def test_in_process_tool_calls_equal_the_action_texts(case):
    env_id, kwargs, names = CASES[case]
    expected = local_episode(env_id, kwargs, seed=3)
    env = MemenvToolsEnvironment(env_id, kwargs)
    try:
        assert_schemas(env.step(ListToolsAction()).tools, names)
        env.reset(seed=3)
        for name, arguments, step in expected:
            observation = env.step(CallToolAction(tool_name=name, arguments=arguments))
            assert observation.error is None, observation.error
            assert json.loads(json.dumps(observation.result)) == step
            assert observation.reward == step["reward"] and observation.done == (step["terminated"] or step["truncated"])
        assert "summary" in expected[-1][2]["info"] and env.state.done
    finally:
        env.close()


def test_openenv_mcp_tool_client_plays_the_in_process_episode():
    from openenv.core.mcp_client import MCPToolClient

    env_id, kwargs, names = CASES["memqa"]
    with BackgroundServer(env_id, kwargs, max_sessions=2) as server:
        for seed in (0, 1):
            expected = local_episode(env_id, kwargs, seed)
            with MCPToolClient(base_url=server.url).sync() as client:
                assert_schemas(client.list_tools(), names)
                first = client.reset(seed=seed)
                assert "<task>" in first.observation.text
                for name, arguments, step in expected:
                    assert client.call_tool(name, **arguments) == step
                assert client.state().step_count == len(expected)
                assert server.sessions.open_sessions == 1  # the client's /mcp session, played over /ws
            assert server.sessions.open_sessions == 0  # closed with openenv/session/close


def test_mcp_over_the_websocket_session_equals_in_process():
    from websockets.sync.client import connect as ws_connect

    env_id, kwargs, names = CASES["beam"]
    expected = local_episode(env_id, kwargs, seed=2)
    with BackgroundServer(env_id, kwargs) as server, \
            ws_connect(server.url.replace("http", "ws", 1) + "/ws", open_timeout=10) as ws:
        def ask(message):
            ws.send(json.dumps(message))
            return json.loads(ws.recv(timeout=30))

        listed = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
        assert listed["type"] == "mcp" and listed["data"]["id"] == 1
        assert_schemas(listed["data"]["result"]["tools"], names)
        assert ask({"type": "reset", "data": {"seed": 2}})["type"] == "observation"
        for i, (name, arguments, step) in enumerate(expected):
            if i % 2:  # an MCP request in the session ...
                reply = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                                     "params": {"name": name, "arguments": arguments}}})
                assert reply["data"]["result"]["data"] == step
                assert reply["data"]["result"]["content"] == [{"type": "text", "text": step["text"]}]
            else:  # ... or OpenEnv's call_tool action as a step: reward and done beside the result
                reply = ask({"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}})
                data = reply["data"]
                assert data["observation"]["result"] == step and data["observation"]["error"] is None
                assert data["reward"] == step["reward"] and data["done"] == (step["terminated"] or step["truncated"])


def test_refused_tool_calls_are_one_line_and_change_nothing():
    from websockets.sync.client import connect as ws_connect

    env_id, kwargs, _ = CASES["memqa"]
    expected = local_episode(env_id, kwargs, seed=4)
    bad = [({"name": "mem_add", "arguments": {"text": 5}}, "mem_add: argument 'text': Input should be a valid string"),
           ({"name": "mem_add", "arguments": {}}, "mem_add: argument 'text': Missing required argument"),
           ({"name": "mem_delete", "arguments": {"id": "two"}}, "mem_delete: argument 'id':"),
           ({"name": "jump", "arguments": {}}, "jump: Unknown tool: 'jump'"),
           ({"name": "mem_add", "arguments": [1]}, "tools/call: 'name' must be a string and 'arguments' a JSON object"),
           ({"arguments": {}}, "tools/call: 'name' must be a string")]
    with BackgroundServer(env_id, kwargs) as server, \
            ws_connect(server.url.replace("http", "ws", 1) + "/ws", open_timeout=10) as ws:
        def ask(message):
            ws.send(json.dumps(message))
            return json.loads(ws.recv(timeout=30))

        ask({"type": "reset", "data": {"seed": 4}})
        for i, (name, arguments, step) in enumerate(expected):
            params, says = bad[i % len(bad)]
            reply = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}})
            message = reply["data"]["error"]["message"]
            assert message.startswith(says) and "\n" not in message, (params, message)
            assert ask({"type": "state"})["data"]["step_count"] == i  # nothing changed
            reply = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                                 "params": {"name": name, "arguments": arguments}}})
            assert reply["data"]["result"]["data"] == step
        reply = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                                             "params": {"name": "mem_add", "arguments": {"text": "late"}}}})
        assert "finished episode" in reply["data"]["error"]["message"]  # as in-process: a step after the end
        for frame, says in [({"type": "mcp", "data": [1]}, "a JSON-RPC request must be a JSON object, got an array"),
                            ({"type": "mcp", "data": {"method": "tools/list"}}, "a JSON-RPC request needs"),
                            ({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "fly"}}, "unknown method 'fly'")]:
            error = ask(frame)["data"]["error"]
            assert error["message"].startswith(says) and "\n" not in error["message"], (frame, error)
        reply = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "mem_add", "colour": "red"}})
        assert reply["type"] == "error" and "unknown field(s) ['colour']" in reply["data"]["message"]


def _post(url, body):
    request = urllib.request.Request(url + "/mcp", data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=20) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def test_http_mcp_sessions_count_toward_the_limit_and_are_reaped():
    import time

    from memenv.openenv import connect

    with BackgroundServer("MemQA-v0", {"objectives": 1}, max_sessions=2, session_timeout_s=1.0) as server:
        # a rewrite-mode env has no tools: one line saying so (the validator's probe: status 200, JSON-RPC)
        error = _post(server.url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})["error"]
        assert error["message"].startswith("this env has no MCP tools") and "\n" not in error["message"]
        assert _post(server.url, {})["error"]["message"].startswith("a JSON-RPC request needs")
        with pytest.raises(urllib.error.HTTPError) as refused:  # not JSON at all: 400, a JSON-RPC parse error
            _post(server.url, b"{")
        assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["code"] == -32700
        ids = [_post(server.url, {"jsonrpc": "2.0", "id": i, "method": "openenv/session/create"})["result"]["session_id"]
               for i in range(2)]
        assert server.sessions.open_sessions == 2
        full = _post(server.url, {"jsonrpc": "2.0", "id": 3, "method": "openenv/session/create"})["error"]
        assert full["message"] == "server full: 2 of 2 sessions open, try again later"
        with pytest.raises(RuntimeError, match="server full: 2 of 2"):
            connect(server.url)
        closed = _post(server.url, {"jsonrpc": "2.0", "id": 4, "method": "openenv/session/close",
                                    "params": {"session_id": ids[0]}})
        assert closed["result"] == {"session_id": ids[0], "closed": True} and server.sessions.open_sessions == 1
        deadline = time.monotonic() + 20  # the other one is never closed: the idle reaper ends it
        while server.sessions.open_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.sessions.open_sessions == 0
        gone = _post(server.url, {"jsonrpc": "2.0", "id": 5, "method": "openenv/session/close",
                                  "params": {"session_id": ids[1]}})["error"]
        assert gone["message"] == f"unknown session_id {ids[1]!r}"


def test_a_tool_argument_of_another_json_type_is_refused_as_in_process():
    """Before: FastMCP coerced ``true`` to entry 1 (and "1" or 1.0 likewise) and the call acted; the action text
    has no such reading."""
    env = MemenvToolsEnvironment("MemQA-v0", {"objectives": 1, "memory_mode": "tools"})
    try:
        env.reset(seed=0)
        added = env.step(CallToolAction(tool_name="mem_add", arguments={"text": "alpha"}))
        assert added.error is None and env.state.step_count == 1
        for value, kind in ((True, "a boolean"), ("1", "a string"), (1.0, "a number"), ([1], "an array")):
            for tool, arguments in (("mem_delete", {"id": value}), ("mem_update", {"id": value, "text": "beta"})):
                refused = env.step(CallToolAction(tool_name=tool, arguments=arguments))
                assert refused.error is not None and refused.error.message.startswith(
                    f"{tool}: argument 'id': must be a JSON integer, got {kind}"), refused.error
                assert env.state.step_count == 1  # nothing changed
        assert env.step(CallToolAction(tool_name="mem_delete", arguments={"id": 1})).error is None
        assert env.state.step_count == 2
    finally:
        env.close()


def test_the_env_of_a_reaped_or_closed_session_is_garbage_collected():
    """Before: FastMCP's cache of tool functions (an lru_cache of 5000) held every tools-mode session's env
    through the functions' closure, so a server whose clients never close grew by each reaped session's env
    (~64 MB over 15 sessions with --max-sessions 3 --session-timeout 1). Now the env of every ended session,
    reaped or closed, over POST /mcp or /ws, is garbage once the session ends."""
    import gc
    import time
    import weakref

    from websockets.sync.client import connect as ws_connect

    kwargs = {"objectives": 1, "memory_mode": "tools"}
    refs = {}

    def watch(session_id, how):
        session = server.sessions.sessions[session_id]
        refs[how] = (weakref.ref(session.env), weakref.ref(session.env.env.unwrapped))

    def create(i):
        return _post(server.url, {"jsonrpc": "2.0", "id": i, "method": "openenv/session/create"})["result"]["session_id"]

    def call(session_id, i):  # reset over a socket attached to the session, then a tool call over POST /mcp
        with ws_connect(server.url.replace("http", "ws", 1) + f"/ws?session_id={session_id}", open_timeout=10) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        reply = _post(server.url, {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "session_id": session_id, "name": "mem_add", "arguments": {"text": f"entry {i}"}}})
        assert reply["result"]["data"]["text"], reply

    # A timeout that leaves time to look at each session before the reaper ends it.
    with BackgroundServer("MemQA-v0", kwargs, max_sessions=3, session_timeout_s=4.0) as server:
        closed = create(0)
        watch(closed, "closed over /mcp")
        call(closed, 0)
        assert _post(server.url, {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/close",
                                  "params": {"session_id": closed}})["result"]["closed"] is True
        reaped = create(2)  # clients that never close: the reaper ends these
        watch(reaped, "reaped over /mcp")
        call(reaped, 3)
        with ws_connect(server.url.replace("http", "ws", 1) + "/ws", open_timeout=10) as ws:
            for message in ({"type": "reset", "data": {"seed": 0}}, {"type": "mcp", "data": {
                    "jsonrpc": "2.0", "id": 4, "method": "tools/call",
                    "params": {"name": "mem_add", "arguments": {"text": "x"}}}}):
                ws.send(json.dumps(message))
                assert "error" not in json.loads(ws.recv(timeout=30))["data"]
            (ws_id,) = set(server.sessions.sessions) - {reaped}
            watch(ws_id, "reaped over /ws")
            deadline = time.monotonic() + 60  # the idle reaper ends both; it closes the socket
            while server.sessions.open_sessions and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.sessions.open_sessions == 0
        gc.collect()
        alive = {how: sum(ref() is not None for ref in pair) for how, pair in refs.items()}
        assert alive == {"closed over /mcp": 0, "reaped over /mcp": 0, "reaped over /ws": 0}, alive


def test_a_session_is_idle_from_when_its_env_is_made_not_from_when_it_was_asked_for(monkeypatch):
    """Before: ``last_active`` was the moment the session was asked for, so an env that took longer to make than
    --session-timeout was reaped at the reaper's next sweep, before its client could use it."""
    import asyncio

    import memenv.openenv.sessions as sessions
    from memenv.openenv.sessions import SessionHub

    clock = [100.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: clock[0])

    def slow_factory():
        clock[0] += 50.0  # the env takes 50 s to make
        return MemenvToolsEnvironment("MemQA-v0", {"objectives": 1, "memory_mode": "tools"})

    hub = SessionHub(slow_factory, max_sessions=1, idle_timeout_s=None)

    async def open_one():
        session, why = await hub._open(None)
        assert why == ""
        try:
            return session.last_active
        finally:
            await hub.end(session, sessions.CLOSE_BY_CLIENT, "test over")

    assert asyncio.run(open_one()) == 150.0
