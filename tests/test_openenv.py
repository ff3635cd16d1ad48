"""memenv over OpenEnv (memenv.openenv, `memenv serve`): served episodes equal in-process ones (observations,
rewards, flags and every key of every snapshot and summary), sessions are isolated under 32 concurrent clients,
a client dropping mid-episode frees its session, bad action text is an invalid step, errors come back as errors.

Every server binds 127.0.0.1 on a free port. Skips when openenv is absent (pip install 'memenv[openenv]').
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("openenv.core.env_server", reason="openenv not installed: pip install 'memenv[openenv]'")

import memenv  # noqa: E402,F401
from agents.scripted import make_strategy  # noqa: E402
from memenv.openenv import BackgroundServer, MemenvEnvironment, MemenvAction, connect, jsonable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# (env id, kwargs, memory_mode for the strategy registry, a scripted strategy that reads only observations)
CASES = {
    "memqa-rewrite": ("MemQA-v0", {}, None, "relevance"),
    "memqa-tools": ("MemQA-v0", {"memory_mode": "tools", "max_turns": 12}, "tools", "rag"),
    "memread": ("MemRead-v0", {}, None, "keep-all"),
    "memdialog": ("MemDialog-v0", {}, None, "keep-all"),
    "beam-tools": ("MemDialog-BEAM-v0", {"chat_tokens": 4000, "max_tool_calls": 4}, "tools", "rag"),
}
# Played first in every episode: never an error, always an invalid step (same as in-process).
BAD_ACTIONS = ["garbage", 5, "<memory>unclosed", "<search>a</search><search>b</search>"]


def _roundtrip(value):
    """What the in-process value becomes through JSON (tuples -> lists)."""
    return json.loads(json.dumps(jsonable(value)))


def play(env, strategy, seed: int, bad=BAD_ACTIONS):
    """The whole episode as data: reset (obs, info), then per step (action, obs, reward, terminated, truncated, info)."""
    obs, info = env.reset(seed=seed)
    strategy.reset(None)
    steps = []
    for action in bad:
        out = env.step(action)
        steps.append((action, *out))
        obs = out[0]
        if out[2] or out[3]:
            return (obs, info), steps
    while True:
        action = strategy.act(obs)
        out = env.step(action)
        steps.append((action, *out))
        obs = out[0]
        if out[2] or out[3]:
            return (obs, info), steps


def assert_same_episode(local, served):
    (l_obs, l_info), l_steps = local
    (s_obs, s_info), s_steps = served
    assert s_info == _roundtrip(l_info)
    assert len(s_steps) == len(l_steps)
    for turn, (ls, ss) in enumerate(zip(l_steps, s_steps), 1):
        l_action, l_o, l_r, l_te, l_tr, l_i = ls
        s_action, s_o, s_r, s_te, s_tr, s_i = ss
        assert s_action == l_action
        assert s_o == l_o, f"turn {turn}: observations differ"
        assert s_r == l_r and type(s_r) is float
        assert (s_te, s_tr) == (l_te, l_tr)
        assert set(s_i) == set(l_i)
        assert set(s_i["invocation"]) == set(l_i["invocation"])
        for key, value in l_i["invocation"].items():
            assert s_i["invocation"][key] == _roundtrip(value), f"turn {turn}: invocation[{key!r}] differs"
        assert s_i == _roundtrip(l_i)
    summary = s_steps[-1][-1]["summary"]
    local_summary = l_steps[-1][-1]["summary"]
    assert set(summary) == set(local_summary)
    assert len(summary["snapshots"]) == len(local_summary["snapshots"]) == len(l_steps)
    for snap, local_snap in zip(summary["snapshots"], local_summary["snapshots"]):
        assert set(snap) == set(local_snap)
        assert snap == _roundtrip(local_snap)


@pytest.fixture(scope="module")
def servers():
    """One server per case, started on first use, all closed at the end of the module."""
    started = {}

    def get(case):
        if case not in started:
            env_id, kwargs, _, _ = CASES[case]
            started[case] = BackgroundServer(env_id, kwargs)
        return started[case]

    yield get
    for server in started.values():
        server.close()


@pytest.mark.parametrize("case", list(CASES))
def test_served_episodes_equal_in_process_ones(case, servers):
    env_id, kwargs, mode, name = CASES[case]
    server = servers(case)
    served = connect(server.url)
    local = gym.make(env_id, **kwargs)
    try:
        for seed in (0, 1):
            a = play(local, make_strategy(name, env_id, mode), seed)
            b = play(served, make_strategy(name, env_id, mode), seed)
            assert_same_episode(a, b)
            steps = a[1]
            assert not any(s[-1]["invocation"]["valid"] for s in steps[:len(BAD_ACTIONS)])  # the bad ones
            assert any(s[-1]["invocation"]["valid"] for s in steps[len(BAD_ACTIONS):])  # the strategy's
            assert "summary" in b[1][-1][-1]
        # A reset without a seed continues the env's generator on both sides, as in-process.
        assert served.reset()[1] == _roundtrip(local.reset()[1])
        state = served.state()
        assert state.env_id == env_id and state.step_count == 0 and not state.done
    finally:
        served.close()


def test_observation_metadata_carries_the_info_in_process():
    env = MemenvEnvironment("MemQA-v0", {"objectives": 1})
    first = env.reset(seed=0)
    assert first.metadata == first.info and "episode_id" in first.info and first.reward is None
    obs = env.step(MemenvAction(text="<memory>m</memory><answer>x</answer>"))
    assert obs.done and obs.terminated and not obs.truncated
    assert obs.metadata["invocation"]["tool"] == "answer" and "summary" in obs.metadata
    json.dumps(obs.model_dump())  # JSON-safe all the way down
    assert env.state.step_count == 1 and env.state.done


def test_32_concurrent_clients_see_only_their_own_episode(servers):
    server = servers("memqa-rewrite")
    env_id, kwargs, mode, name = CASES["memqa-rewrite"]
    seeds = list(range(100, 132))
    local = gym.make(env_id, **kwargs)
    expected = {seed: play(local, make_strategy(name, env_id, mode), seed, bad=["garbage"]) for seed in seeds}
    clients = [connect(server.url) for _ in seeds]  # all 32 sessions open at once
    barrier = threading.Barrier(len(seeds))

    def run(i):
        env, seed = clients[i], seeds[i]
        barrier.wait()  # every session resets, then steps, interleaved with the others
        return play(env, make_strategy(name, env_id, mode), seed, bad=["garbage"])

    try:
        with ThreadPoolExecutor(len(seeds)) as pool:
            results = list(pool.map(run, range(len(seeds))))
        for seed, result in zip(seeds, results):
            assert_same_episode(expected[seed], result)
        assert len({r[0][1]["episode_id"] for r in results}) == len(seeds)
        states = [c.state() for c in clients]
        assert [s.episode_id for s in states] == [r[0][1]["episode_id"] for r in results]
    finally:
        for c in clients:
            c.close()


def _abort(env) -> None:
    """Drop the connection without a goodbye (a crashed or killed trainer), on the client's own event loop."""
    async def drop():
        env.client.async_client._ws.transport.abort()

    env.client._run(drop())


def test_a_client_dropping_mid_episode_frees_its_session():
    with BackgroundServer("MemQA-v0", {"objectives": 1}, max_sessions=1) as server:
        first = connect(server.url)
        first.reset(seed=0)
        first.step("<memory>half way</memory><search>Wigei</search>")
        with pytest.raises(RuntimeError, match="server full: 1 of 1 sessions open"):  # the one slot is taken
            connect(server.url)
        _abort(first)
        deadline = time.monotonic() + 10
        while True:  # the server notices the drop and frees the slot
            try:
                second = connect(server.url)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        obs, info = second.reset(seed=0)
        out = second.step("<memory>m</memory><answer>x</answer>")
        assert out[2] and "summary" in out[4]
        second.close()
        with urllib.request.urlopen(server.url + "/health", timeout=5) as reply:
            assert json.loads(reply.read())["status"] == "healthy"


def test_misuse_comes_back_as_an_error_and_the_session_goes_on(servers):
    env = connect(servers("memqa-rewrite").url)
    try:
        env.reset(seed=0)
        assert env.step("<memory>m</memory><answer>x; y</answer>")[2]
        with pytest.raises(RuntimeError, match="finished episode"):
            env.step("<memory>m</memory><answer>x</answer>")
        with pytest.raises(RuntimeError, match="unknown argument"):
            env.client.reset(seed=0, colour="red")
        obs, info = env.reset(seed=0)  # the session is still usable
        assert "Question 1" in obs
        huge = "<memory>" + "x" * 200_000 + "</memory><search>q</search>"  # over the action space: invalid, not an error
        invocation = env.step(huge)[4]["invocation"]
        assert not invocation["valid"] and invocation["error"]
    finally:
        env.close()


def test_a_bad_seed_is_refused_and_the_session_plays_on(servers):
    # The refusal is the env's own (memenv.envs.base.check_reset_args), before anything changes: the served
    # episode in progress goes on, and a later reset plays the same episode as in-process.
    local = gym.make("MemQA-v0")
    local_obs, _ = local.reset(seed=0)
    local_next = local.step("<memory>m</memory><search>q</search>")[0]
    env = connect(servers("memqa-rewrite").url)
    try:
        for seed in (-1, 1.5):  # the client checks as the env does, before sending
            with pytest.raises(ValueError, match="seed must be an int >= 0"):
                env.reset(seed=seed)
        with pytest.raises(RuntimeError, match="seed must be an int >= 0"):  # sent as is: the server refuses
            env.client.reset(seed=-1)
        assert env.reset(seed=0)[0] == local_obs
        with pytest.raises(RuntimeError, match="seed must be an int >= 0"):
            env.client.reset(seed=-1)
        assert env.step("<memory>m</memory><search>q</search>")[0] == local_next
    finally:
        env.close()
    in_process = MemenvEnvironment("MemQA-v0")
    with pytest.raises(ValueError, match="seed"):
        in_process.reset(seed=-1)
    assert in_process.reset(seed=0).text == local_obs


def test_the_generic_openenv_client_plays_too(servers):
    from openenv.core import GenericEnvClient

    url = servers("memqa-tools").url
    with urllib.request.urlopen(url + "/schema", timeout=5) as reply:
        schema = json.loads(reply.read())
    assert "text" in schema["action"]["properties"] and "info" in schema["observation"]["properties"]
    with GenericEnvClient(base_url=url).sync() as client:
        first = client.reset(seed=0)
        assert "<task>" in first.observation["text"] and first.done is False
        result = client.step({"text": "<mem_add>Wigei is in Pelor</mem_add>"})
        invocation = result.observation["info"]["invocation"]
        assert invocation["tool"] == "mem_add" and invocation["entry_id"] == 1 and result.reward == 0.0


def test_memenv_serve_command(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "memenv.cli", "serve", "MemQA-v0", "--kw", "objectives=1",
                             "--host", "127.0.0.1", "--port", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "memenv serve: MemQA-v0 at http://127.0.0.1:PORT (...)"
        assert line.startswith("memenv serve: MemQA-v0 at http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split(" at ")[1].split()[0]
        served = connect(url)
        local = gym.make("MemQA-v0", objectives=1)
        assert_same_episode(play(local, make_strategy("relevance"), 7), play(served, make_strategy("relevance"), 7))
        served.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_memenv_serve_refuses_a_bad_env_in_one_line(capsys):
    from memenv.cli import main

    assert main(["serve", "MemQA-v0", "--kw", "objectives=0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memenv serve: error: MemQA-v0:") and "objectives" in err and "Traceback" not in err
    assert main(["serve", "NoSuch-v0"]) == 2
    assert "MemQA-v0" in capsys.readouterr().err  # names the envs there are


# --- the session lifecycle: sessions end for the client, with a reason, and count until they end -------------

def _wait_until(predicate, what: str, timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` (a bound on waiting, not a timing assertion: the server decides when)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _raw_session(url: str):
    """A bare WebSocket session (any OpenEnv client), without memenv's client in between."""
    from websockets.sync.client import connect as ws_connect

    return ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=10)


def _closed_by_server(ws, timeout_s: float = 20.0):
    """The close frame the server sent on ``ws`` (reading and dropping any message before it)."""
    from websockets.exceptions import ConnectionClosed

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        except ConnectionClosed as exc:
            return exc.rcvd
        except TimeoutError:
            break
    raise AssertionError("the server did not close the session")


def test_an_idle_session_is_closed_with_a_reason_and_the_client_is_told():
    from memenv.openenv import SessionEndedError

    with BackgroundServer("MemQA-v0", {"objectives": 1}, max_sessions=2, session_timeout_s=1.0) as server:
        env = connect(server.url)
        env.reset(seed=0)
        env.step("<memory>m</memory><search>Wigei</search>")
        with _raw_session(server.url) as raw:
            raw.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(raw.recv(timeout=20))["type"] == "observation"
            frame = _closed_by_server(raw)  # the server ends the session: a close frame with the reason
        assert frame.code == 4000 and frame.reason == "session idle for 1 s (the server's --session-timeout)"
        _wait_until(lambda: server.sessions.open_sessions == 0, "the idle sessions to be reaped")
        for _ in range(2):  # the next call, and every one after it: one error naming the URL and the reason
            with pytest.raises(SessionEndedError) as caught:
                env.step("<memory>m</memory><answer>x</answer>")
            message = str(caught.value)
            assert server.url in message and "session idle for 1 s" in message and "\n" not in message
        with pytest.raises(SessionEndedError, match="session idle"):
            env.reset(seed=0)
        env.close()
        again = connect(server.url)  # the freed slot takes a new session, which plays from the start
        assert again.reset(seed=0)[0] == gym.make("MemQA-v0", objectives=1).reset(seed=0)[0]
        again.close()


def test_a_close_that_reaches_the_client_during_a_call_still_ends_the_session():
    """The race a loaded machine opened (CI, 2026-12-07): the server's close frame reached the client's loop after
    the wrapper's check saw the socket open but before the call's send, so openenv reconnected to a new session
    and the step came back "step before reset". Replayed here: the socket reads as open to that check only."""
    from websockets.protocol import State as SocketState

    from memenv.openenv import SessionEndedError

    class LateClose:  # the real socket, whose close the wrapper's check does not see yet
        def __init__(self, ws):
            self._ws, self._reads = ws, 0

        def __getattr__(self, name):
            return getattr(self._ws, name)

        @property
        def state(self):
            self._reads += 1
            return SocketState.OPEN if self._reads == 1 else self._ws.state

    with BackgroundServer("MemQA-v0", {"objectives": 1}, max_sessions=2, session_timeout_s=1.0) as server:
        env = connect(server.url)
        env.reset(seed=0)
        _wait_until(lambda: server.sessions.open_sessions == 0, "the idle session to be reaped")
        socket = env.client.async_client._ws
        _wait_until(lambda: socket.state == SocketState.CLOSED, "the client to see the close")
        env.client.async_client._ws = LateClose(socket)
        with pytest.raises(SessionEndedError, match="session idle for 1 s") as caught:
            env.step("<memory>m</memory><answer>x</answer>")
        assert server.url in str(caught.value)
        with pytest.raises(SessionEndedError, match="session idle for 1 s"):  # and every later call
            env.reset(seed=0)
        # the session openenv opened under the call is closed again: the server's slots are free
        _wait_until(lambda: server.sessions.open_sessions == 0, "the reconnected session to be closed")
        env.close()


def test_a_session_in_use_is_not_reaped():
    with BackgroundServer("MemQA-v0", {"objectives": 1}, session_timeout_s=1.5) as server:
        env = connect(server.url)
        started = time.monotonic()
        episodes = 0
        while time.monotonic() - started < 4.0:  # over two timeouts long, never idle for one
            env.reset(seed=episodes)
            done = False
            while not done:
                done = env.step("<memory>m</memory><answer>x</answer>")[2]
            episodes += 1
        assert server.sessions.open_sessions == 1 and episodes > 1
        env.close()
        _wait_until(lambda: server.sessions.open_sessions == 0, "the closed session to be freed")


def test_never_closed_sessions_count_until_reaped_and_extra_clients_are_refused_with_a_reason():
    # The timeout is long enough for the checks of a wave to run before the first holder is reaped.
    with BackgroundServer("MemQA-v0", {"objectives": 1}, max_sessions=3, session_timeout_s=2.0) as server:
        for wave in range(2):
            with contextlib.ExitStack() as stack:
                holders = [stack.enter_context(_raw_session(server.url)) for _ in range(3)]  # never closed
                for ws in holders:
                    ws.send(json.dumps({"type": "reset", "data": {"seed": wave}}))
                    assert json.loads(ws.recv(timeout=20))["type"] == "observation"
                assert server.sessions.open_sessions == 3
                with _raw_session(server.url) as extra:  # a fourth client: an OpenEnv error, then a close frame
                    refusal = json.loads(extra.recv(timeout=20))
                    assert refusal["type"] == "error" and refusal["data"]["code"] == "CAPACITY_REACHED"
                    frame = _closed_by_server(extra)
                    assert frame.code == 1013 and frame.reason == "server full: 3 of 3 sessions open, try again later"
                assert server.sessions.open_sessions == 3  # the refused one never counted
                for ws in holders:  # each is reaped in turn and told so; only then is its slot free
                    assert _closed_by_server(ws).code == 4000
            _wait_until(lambda: server.sessions.open_sessions == 0, "the never-closed sessions to be reaped")


# Each a reset the server refuses before the env sees it: (data, the field the one-line error names).
BAD_RESETS = [({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": "7"}, "seed"), ({"seed": True}, "seed"),
              ({"options": [1]}, "options"), ({"episode_id": ["a"]}, "episode_id"), ({"colour": "red"}, "colour")]


def test_bad_resets_are_refused_in_one_line_and_never_poison_the_session(servers):
    server = servers("memqa-rewrite")
    local = gym.make("MemQA-v0")
    local.reset(seed=3)
    expected = [local.step(f"<memory>turn {i}</memory><search>Wigei</search>")[0] for i in range(len(BAD_RESETS))]
    with _raw_session(server.url) as ws:
        def ask(message):
            ws.send(json.dumps(message))
            return json.loads(ws.recv(timeout=20))

        for data, field in BAD_RESETS:  # before any reset: refused, and the session still answers
            reply = ask({"type": "reset", "data": data})
            assert reply["type"] == "error", data
            message = reply["data"]["message"]
            assert message.startswith("reset: ") and field in message and "\n" not in message, message
            assert ask({"type": "state"})["type"] == "state"
        assert ask({"type": "reset", "data": {"seed": 3, "episode_id": "mine"}})["type"] == "observation"
        for i, (data, field) in enumerate(BAD_RESETS):  # mid-episode: refused, and the episode goes on unchanged
            assert ask({"type": "reset", "data": data})["data"]["message"].startswith("reset: ")
            state = ask({"type": "state"})["data"]
            assert state["step_count"] == i and state["client_episode_id"] == "mine"
            reply = ask({"type": "step", "data": {"text": f"<memory>turn {i}</memory><search>Wigei</search>"}})
            assert reply["data"]["observation"]["text"] == expected[i]
    for data, field in BAD_RESETS:  # the stateless HTTP reset: 4xx with the line, never 500
        request = urllib.request.Request(server.url + "/reset", data=json.dumps(data).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=20)
        assert 400 <= caught.value.code < 500, (data, caught.value.code)
        detail = json.loads(caught.value.read())["detail"]
        assert isinstance(detail, str) and field in detail and "\n" not in detail, (data, detail)


# Each a frame no client should send: (frame, what the one-line error says). None of it is an action text
# (those are invalid steps, never errors), so every one is answered with an error and the session goes on.
BAD_FRAMES = [
    ("[1, 2]", "message must be a JSON object with a 'type' field (reset, step, state, mcp or close), got an array"),
    (b"\x00\x01binary", "binary frames are not accepted"),
    ("null", "message must be a JSON object with a 'type' field (reset, step, state, mcp or close), got null"),
    ('"step"', "message must be a JSON object with a 'type' field (reset, step, state, mcp or close), got a string"),
    ('{"data": {"text": "x"}}', "message must be a JSON object with a 'type' field"),
    ("not json {", "message is not JSON"),
    ('{"type": "jump"}', "unknown message type 'jump'"),
    ('{"type": ["step"]}', "unknown message type ['step']"),
    ('{"type": "step"}', "step: 'data' must have a 'text' field"),
    ('{"type": "step", "data": [1]}', "step: 'data' must be a JSON object, got an array"),
    ('{"type": "step", "data": "text"}', "step: 'data' must be a JSON object, got a string"),
    ('{"type": "step", "data": {"text": "x", "speed": 1}}', "step: unknown field(s) ['speed'] in 'data'"),
    ('{"type": "step", "data": {"text": "x", "metadata": 3}}', "step: metadata:"),
    ('{"type": "reset", "data": {"seed": 0}, "extra": 1}', "reset: unknown field(s) ['extra']"),
    ('{"type": "state", "data": 5}', "state: 'data' must be a JSON object, got a number"),
]


def test_every_wire_error_is_one_line_naming_the_field_and_the_session_goes_on(servers):
    server = servers("memqa-rewrite")
    local = gym.make("MemQA-v0")
    first = local.reset(seed=5)[0]
    actions = [f"<memory>turn {i}</memory><search>Wigei</search>" for i in range(4)]
    expected = [local.step(action)[0] for action in actions]
    with _raw_session(server.url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 5}}))
        assert json.loads(ws.recv(timeout=20))["data"]["observation"]["text"] == first
        steps = 0
        for i, (frame, says) in enumerate(BAD_FRAMES):
            ws.send(frame)
            reply = json.loads(ws.recv(timeout=20))
            message = reply["data"]["message"]
            assert reply["type"] == "error" and message.startswith(says), (frame, message)
            assert "\n" not in message and "object has no attribute" not in message, (frame, message)
            ws.send(json.dumps({"type": "state"}))  # nothing of the episode changed
            assert json.loads(ws.recv(timeout=20))["data"]["step_count"] == steps, frame
            if i % 4 == 0:  # and it plays on as in-process
                ws.send(json.dumps({"type": "step", "data": {"text": actions[steps]}}))
                assert json.loads(ws.recv(timeout=20))["data"]["observation"]["text"] == expected[steps], frame
                steps += 1


def test_http_misuse_is_a_4xx_with_one_line(servers):
    url = servers("memqa-rewrite").url
    misuse = [("POST", "/step", {"action": {"text": "<memory>m</memory><search>q</search>"}}, 409, "/ws"),
              ("POST", "/step", [1, 2], 409, "/ws"),
              ("POST", "/reset", [1], 400, "JSON object"),
              ("POST", "/reset", "{", 400, "not valid JSON"),
              ("GET", "/step", None, 405, "Method Not Allowed"),
              ("GET", "/nowhere", None, 404, "Not Found")]
    for method, path, body, status, says in misuse:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
        request = urllib.request.Request(url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=20)
        detail = json.loads(caught.value.read())["detail"]
        assert caught.value.code == status and isinstance(detail, str) and says in detail, (method, path, detail)
        assert "\n" not in detail
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    with pytest.raises(InvalidStatus):  # no WebSocket /mcp: its sessions would count outside --max-sessions
        ws_connect(url.replace("http", "ws", 1) + "/mcp", open_timeout=10)


def _drop(ws, reset: bool) -> None:
    """Drop a raw session's TCP connection without a close frame: with a RST (a killed process) or a FIN."""
    import socket
    import struct

    sock = ws.socket
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def test_clients_dropping_mid_request_print_no_tracebacks(tmp_path):
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "memenv.cli", "serve", "MemQA-v0", "--port", "0",
                                 "--max-sessions", "25"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("memenv serve: MemQA-v0 at "), (line, log.read_text())
        url = line.split(" at ")[1].split()[0]
        with contextlib.ExitStack() as stack:
            clients = [stack.enter_context(_raw_session(url)) for _ in range(20)]
            for i, ws in enumerate(clients):  # each sends a request and is gone before the reply
                ws.send(json.dumps({"type": "reset", "data": {"seed": i}}))
                if i % 2:
                    ws.send(json.dumps({"type": "step", "data": {"text": "<memory>m</memory><search>q</search>"}}))
                _drop(ws, reset=i % 3 == 0)
        served = connect(url)  # the server plays on, and every dropped session was freed
        local = gym.make("MemQA-v0")
        assert_same_episode(play(local, make_strategy("relevance"), 7), play(served, make_strategy("relevance"), 7))
        with contextlib.ExitStack() as stack:  # 25 slots: 24 more sessions fit beside `served` once all are freed
            deadline, more = time.monotonic() + 30, 0
            while more < 24:
                try:
                    stack.callback(connect(url).close)
                    more += 1
                except RuntimeError:  # a dropped session not freed yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        served.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    printed = log.read_text()
    assert "Traceback" not in printed and len(printed.splitlines()) <= 20, printed


def test_a_call_after_the_server_is_gone_is_one_error_naming_the_url():
    from memenv.openenv import SessionEndedError

    server = BackgroundServer("MemQA-v0", {"objectives": 1})
    env = connect(server.url)
    env.reset(seed=0)
    server.close()  # a clean shutdown: uvicorn closes every session (1012)
    for call in (lambda: env.step("<memory>m</memory><search>q</search>"), lambda: env.reset(seed=1), env.state):
        with pytest.raises(SessionEndedError) as caught:
            call()
        assert str(caught.value).startswith(f"the OpenEnv session at {server.url} has ended: the server closed it")
    env.close()

    proc = subprocess.Popen([sys.executable, "-m", "memenv.cli", "serve", "MemQA-v0", "--port", "0"], cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split(" at ")[1].split()[0]
        env = connect(url)
        env.reset(seed=0)
    finally:
        proc.kill()  # gone without a close frame
        proc.wait(timeout=30)
    for _ in range(2):
        with pytest.raises(SessionEndedError) as caught:
            env.step("<memory>m</memory><search>q</search>")
        message = str(caught.value)
        assert url in message and "connection was lost" in message and "\n" not in message
    env.close()
    with pytest.raises(ConnectionError) as caught:  # and a new session: one line naming the URL
        connect(url)
    assert str(caught.value).startswith(f"cannot reach the OpenEnv server at {url}: ") and "\n" not in str(caught.value)


# --------------------------------------------------------------------------------------- hostile HTTP requests
def _http(url: str, path: str, body: bytes | None = None, headers: dict | None = None, method: str = "POST"):
    """``(status, decoded JSON reply)`` of one request (an error status is a reply, not an exception)."""
    request = urllib.request.Request(url + path, data=body, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _one_line(reply) -> str:
    text = reply["detail"] if "detail" in reply else reply["error"]["message"]
    assert isinstance(text, str) and "\n" not in text and "Traceback" not in text
    return text


def test_bad_http_bodies_get_a_4xx_of_one_line_and_memory_stays_bounded():
    """Before: a body that is not UTF-8 and a session_id that is an array or an object were 500s with a traceback,
    and a body of any size was read and parsed whole."""
    import http.client
    import tracemalloc

    from memenv.openenv import MAX_HTTP_BODY_BYTES

    with BackgroundServer("MemQA-v0", {"objectives": 1}) as server:
        status, reply = _http(server.url, "/reset", b'{"seed": "\xff\xfe"}')
        assert status == 400 and _one_line(reply).startswith("the request body is not UTF-8 text (byte 10)")
        status, reply = _http(server.url, "/mcp", b"\xff")  # a 400, not a 200 with an error (nor a 500)
        assert status == 400 and reply["error"]["code"] == -32700 and reply["id"] is None
        assert _one_line(reply) == "the request body is not UTF-8 text (byte 0); send JSON as UTF-8"
        status, reply = _http(server.url, "/mcp", b'{"jsonrpc": "2.0", "method": "tools/list", "x": "\xe9"}')
        assert status == 400 and _one_line(reply) == "the request body is not UTF-8 text (byte 49); send JSON as UTF-8"
        status, reply = _http(server.url, "/mcp", b"{")
        assert status == 400 and _one_line(reply).startswith("the request body is not valid JSON")
        status, reply = _http(server.url, "/mcp", b"{}")  # JSON but not JSON-RPC: 200 and a JSON-RPC error (the
        assert status == 200 and reply["jsonrpc"] == "2.0" and "error" in reply  # openenv validator's probe)
        for session_id, kind in (([1, 2], "an array"), ({"a": 1}, "an object"), (7, "a number")):
            for method in ("openenv/session/close", "tools/list"):
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"session_id": session_id}}
                status, reply = _http(server.url, "/mcp", json.dumps(body).encode())
                assert status == 200 and _one_line(reply) == f"'session_id' must be a string, got {kind}"
        over = MAX_HTTP_BODY_BYTES + 1
        tracemalloc.start()
        for path in ("/reset", "/mcp"):
            status, reply = _http(server.url, path, b" " * (over - 2) + b"{}")
            assert status == 413 and _one_line(reply).startswith(f"the request body is over the server's limit of "
                                                                 f"{MAX_HTTP_BODY_BYTES} bytes")
            # no Content-Length (chunked): refused after at most the limit was read
            host, port = server.url.split("//")[1].split(":")
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            chunks = (b" " * 65536 for _ in range(64))  # 4 MiB offered
            connection.request("POST", path, body=chunks, headers={"Content-Type": "application/json"},
                               encode_chunked=True)
            answer = connection.getresponse()
            assert answer.status == 413 and "over the server's limit" in json.loads(answer.read())["detail"]
            connection.close()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 8 * MAX_HTTP_BODY_BYTES  # the server (this process) never held the 4 MiB bodies
        status, reply = _http(server.url, "/reset", b'{"seed": 3}')  # still up, and a good request still works
        assert status == 200 and reply["observation"]["text"]


def test_health_says_whether_the_env_can_reset(tmp_path, monkeypatch):
    """Before: a data file damaged after the start gave bare 500s at /reset while /health said 200."""
    import memenv.openenv.app as openenv_app  # where /health reads it

    monkeypatch.setattr(openenv_app, "HEALTH_TTL_S", 0.0)
    item = {"question_id": "q1", "question_type": "single-session-user", "question": "What is my dog called?",
            "answer": "Biscuit", "question_date": "2023/05/30 (Tue) 10:00",
            "haystack_dates": ["2023/05/20 (Sat) 09:00"], "haystack_session_ids": ["s0"],
            "haystack_sessions": [[{"role": "user", "content": "My dog is called Biscuit.", "has_answer": True}]],
            "answer_session_ids": ["s0"]}
    data = tmp_path / "lme.json"
    data.write_text(json.dumps([item]), encoding="utf-8")
    with BackgroundServer("MemDialog-LongMemEval-v0", {"data_path": str(data)}) as server:
        assert _http(server.url, "/health", method="GET") == (200, {"status": "healthy"})
        assert _http(server.url, "/reset", b"{}")[0] == 200
        before = connect(server.url)  # a session opened before the damage
        data.write_text('[{"question_id": "q1", "answ', encoding="utf-8")  # cut short after the start
        with pytest.raises(Exception, match="DataFormatError") as reset_error:  # its reset names the cause in one line
            before.reset(seed=0)
        assert str(data) in str(reset_error.value) and "\n" not in str(reset_error.value)
        status, reply = _http(server.url, "/health", method="GET")
        assert status == 503 and reply["status"] == "unhealthy" and str(data) in _one_line(reply)
        status, reply = _http(server.url, "/reset", b"{}")
        assert status == 503 and _one_line(reply).startswith("the env cannot reset: DataFormatError:")
        # A new WebSocket session: before, a bare 1011 "could not make the env (see its log)"; now the cause, in an
        # OpenEnv error frame and (cut to 123 bytes) in the close frame, and in ServedEnv's one-line refusal.
        with _raw_session(server.url) as ws:
            refusal = json.loads(ws.recv(timeout=20))
            assert refusal["type"] == "error" and refusal["data"]["code"] == "EXECUTION_ERROR"
            assert refusal["data"]["message"].startswith("the server cannot make the env: DataFormatError:")
            assert str(data) in refusal["data"]["message"]
            frame = _closed_by_server(ws)
            assert frame.code == 1011 and frame.reason.startswith("the server cannot make the env: DataFormatError")
            assert len(frame.reason.encode()) <= 123
        with pytest.raises(RuntimeError, match="refused the session: the server cannot make the env: DataFormatError"):
            connect(server.url)
        data.write_text(json.dumps([item]), encoding="utf-8")  # repaired: healthy again
        env = connect(server.url)  # and a session opens again
        assert env.reset(seed=0)[0]
        assert before.reset(seed=0)[0]  # the session that met the damage plays on
        env.close()
        before.close()
        assert _http(server.url, "/health", method="GET") == (200, {"status": "healthy"})
