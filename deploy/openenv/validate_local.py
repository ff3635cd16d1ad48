"""`openenv validate`'s runtime level for memenv without a container engine: the same runner, graders and
severity policy (openenv.validation.run_validation), with the subject started as a local `memenv serve` process
instead of a Docker container.

    python deploy/openenv/validate_local.py [PACKAGE_ROOT] [--level runtime|semantic] [--json]

openenv 0.10's CLI builds and starts the Dockerfile with Docker for the runtime level; where no Docker daemon
runs (this project's machines: the docker client, no daemon) `openenv validate --level runtime` can only skip it
(`--skip-build`). This provider runs what the image would run, `memenv serve ENV --kw ...` from the manifest's
`memenv:` block, on 127.0.0.1 with this Python, and hands the runner its URL: OpenEnv's collector then plays the
manifest's runtime plan over /ws and its graders judge what came back. What a process cannot give is said by the
capabilities it lacks: no network-policy enforcement (only `network.mode: public` is accepted; the network
check SKIPs), no exec inside a sandbox, no resource limits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml


class LocalProcessSubject:
    """A `memenv serve` process: OpenEnv's RunningSubject protocol (base_url, inspect, logs, exec, stop)."""

    def __init__(self, proc: subprocess.Popen, base_url: str, log: Path) -> None:
        self.proc, self.base_url, self._log = proc, base_url, log

    def inspect(self) -> dict:
        return {"pid": self.proc.pid, "base_url": self.base_url, "provider": "local-process"}

    def logs(self, max_bytes: int = 65536) -> str:
        return self._log.read_text(errors="replace")[-max_bytes:] if self._log.exists() else ""

    def exec(self, argv: list[str], timeout_s: float):
        from openenv.validation.providers import UnsupportedCapability

        raise UnsupportedCapability("a local process has no sandbox to exec in")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


class LocalProcessProvider:
    """OpenEnv's ValidationProvider protocol over a local process. ``build`` checks the package (its manifest
    names an env, the Dockerfile is there) and names the source by its digest; ``start`` runs `memenv serve`."""

    name = "local-process"
    supported_network_modes = frozenset({"public"})

    def __init__(self, python: str = sys.executable, log_dir: Path | None = None) -> None:
        from openenv.validation.types import ProviderCapability

        self.capabilities = frozenset({ProviderCapability.IMAGE_BUILD})
        self.python = python
        self.log_dir = log_dir
        self._root: Path | None = None

    def build(self, root: Path, execution: Any) -> str:
        from openenv.validation.providers import StartupError
        from openenv.validation.runner import source_digest

        root = Path(root)
        if not (root / execution.dockerfile).is_file():
            raise StartupError(f"no {execution.dockerfile} in {root}")
        self._root = root
        return "sha256:" + source_digest(root)

    def start(self, spec: Any) -> LocalProcessSubject:
        import tempfile

        from openenv.validation.providers import StartupError

        root = self._root
        manifest = yaml.safe_load((root / "openenv.yaml").read_text())
        served = manifest.get("memenv") or {}
        env_id, kwargs = served.get("env", "MemQA-v0"), served.get("kwargs") or {}
        command = [self.python, "-m", "memenv.cli", "serve", env_id, "--host", "127.0.0.1", "--port", "0"]
        if kwargs:
            command += ["--kw", *(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                                  for key, value in kwargs.items())]
        log = Path(self.log_dir or tempfile.mkdtemp(prefix="memenv-validate-")) / f"{spec.run_id}.log"
        env = {**os.environ, **spec.env_vars, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
        with open(log, "w") as err:
            proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        line = proc.stdout.readline()  # "memenv serve: ENV at http://127.0.0.1:PORT (...)"
        if " at http://" not in line:
            proc.kill()
            raise StartupError(f"memenv serve did not start: {line.strip() or log.read_text()[-500:]}")
        subject = LocalProcessSubject(proc, line.split(" at ")[1].split()[0], log)
        deadline = time.monotonic() + spec.startup_timeout_s
        while True:  # OpenEnv's readiness: GET /health answers 200
            try:
                with urllib.request.urlopen(subject.base_url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return subject
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                subject.stop()
                raise StartupError("the subject did not answer GET /health with 200 before its deadline")
            time.sleep(0.1)


def package_files(root: Path) -> list[str] | None:
    """The package's files when ``root`` is the top of a git work tree: tracked and untracked ones, never what git
    ignores (``runs/``, ``bench_out/``, caches, a virtual environment); None when ``root`` is no git work tree."""
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
        if Path(top).resolve() != Path(root).resolve():
            return None
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sorted({name for name in listed.decode().split("\0") if name})


def copy_package(root: Path, dest: Path) -> bool:
    """Copy ``root``'s package files (:func:`package_files`: regular files only; a deleted tracked file is
    skipped) into ``dest``; False when ``root`` is no git work tree (nothing copied)."""
    import shutil

    names = package_files(root)
    if names is None:
        return False
    for name in names:
        source = Path(root) / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return True


def validate(root: Path, level: str = "semantic", log_dir: Path | None = None):
    """``openenv.validation.run_validation`` of the package at ``root`` up to ``level``, on a local process.

    A git work tree is validated on a copy of its files that git does not ignore (:func:`copy_package`): the
    runner fails a package whose source changes during validation, and a job writing into the git-ignored
    ``runs/`` would change it. Any other folder is validated in place."""
    import tempfile

    from openenv.validation import Level, run_validation

    def run(target: Path):
        return run_validation(target, max_level=Level[level.upper()], provider=LocalProcessProvider(log_dir=log_dir))

    with tempfile.TemporaryDirectory(prefix="memenv-validate-pkg-") as tmp:
        return run(Path(tmp)) if copy_package(Path(root), Path(tmp)) else run(Path(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--level", default="semantic", choices=["static", "runtime", "semantic"])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = validate(Path(args.root), args.level)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        copied = Path(str(report.target)).resolve() != Path(args.root).resolve()
        print(f"Validation report for {args.root}{' (a copy of its files git does not ignore)' if copied else ''} "
              f"(provider: local-process, policy {report.policy_version}); "
              f"levels run: {', '.join(level.name.lower() for level in report.levels_run)}")
        for result in report.results:
            print(f"  {result.status.value.upper():5s} {result.check_id}: {'; '.join(result.evidence)[:160]}")
        print(f"Verdict: {report.verdict.value.upper()}")
    return 1 if report.verdict.value == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
