"""Server memory over waves of never-closed sessions: ``memenv serve --max-sessions M --session-timeout T``.

    python benchmarks/serve_sessions.py [--env MemQA-v0] [--waves 10] [--max-sessions 3] [--clients 6]
                                        [--session-timeout 1] [--steps 5]

The server runs in its own process (``python -m memenv.cli serve``, loopback, a free port). Each wave opens
``--clients`` bare WebSocket sessions (any OpenEnv client would do) at once: each that is accepted resets, plays
``--steps`` steps and then goes silent, never sending a close and never closing its socket (a trainer that hung or
forgot); each beyond ``--max-sessions`` should be refused. The wave then waits for the server to end the silent
sessions (a close frame, code 4000, after ``--session-timeout``), bounded at 4 timeouts plus 10 s, and reads the
server's resident memory (/proc). Sockets the server never closed stay open for the rest of the run, so a server
that reaps a session without ending it keeps paying for it, wave after wave.

Printed per wave: accepted, refused (with the close reason), ended by the server, sockets still open, server RSS.
Then the spread of the server's RSS over waves 2..N (wave 1 pays for the first env's world and indexes). Bounded:
about waves x (timeout + a few seconds) plus the server's start (~10 s for openenv's imports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTION = "<memory>notes so far</memory><search>Wigei</search>"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_server(env_id: str, max_sessions: int, timeout_s: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "memenv.cli", "serve", env_id, "--port", "0",
                             "--max-sessions", str(max_sessions), "--session-timeout", f"{timeout_s:g}"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # "memenv serve: ENV at http://127.0.0.1:PORT (...)"
    if " at http://" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start (got {line!r})")
    return proc, line.split(" at ")[1].split()[0]


def open_session(ws_url: str, seed: int, steps: int):
    """``(socket, None)`` for a session that played and now stays silent, ``(None, reason)`` for a refused one."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws = connect(ws_url, open_timeout=30, max_size=None)
    try:
        ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
        reply = json.loads(ws.recv(timeout=60))
        if reply["type"] == "error":
            try:
                ws.recv(timeout=10)
            except ConnectionClosed as exc:
                return None, exc.rcvd.reason if exc.rcvd else reply["data"]["message"]
            return None, reply["data"]["message"]
        for _ in range(steps):
            ws.send(json.dumps({"type": "step", "data": {"text": ACTION}}))
            if json.loads(ws.recv(timeout=60))["type"] != "observation":
                break
    except ConnectionClosed as exc:
        return None, exc.rcvd.reason if exc.rcvd else "closed without a reason"
    return ws, None


def ended_by_server(ws, deadline: float) -> int | None:
    """The close code the server ended ``ws`` with, or None if it had not by ``deadline``."""
    from websockets.exceptions import ConnectionClosed

    while time.monotonic() < deadline:
        try:
            ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else 1006
        except TimeoutError:
            return None
    return None


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="MemQA-v0")
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--max-sessions", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6, help="sessions opened per wave (some over the limit)")
    parser.add_argument("--session-timeout", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--steps", type=int, default=5, help="steps each accepted session plays before going silent")
    args = parser.parse_args(argv)
    # The sockets here are held open across waves on purpose, which a `with connect(...)` block cannot express.
    warnings.filterwarnings("ignore", message=r"connect\(\) must be used as a context manager")
    if min(args.waves, args.max_sessions, args.clients) < 1 or args.session_timeout <= 0 or args.steps < 0:
        parser.error("--waves, --max-sessions and --clients must be >= 1, --session-timeout > 0, --steps >= 0")
    proc, url = start_server(args.env, args.max_sessions, args.session_timeout)
    ws_url = url.replace("http", "ws", 1) + "/ws"
    print(f"{args.env} at {url}: --max-sessions {args.max_sessions} --session-timeout {args.session_timeout:g}; "
          f"{args.clients} clients per wave, {args.steps} steps each, never closed")
    print(f"  start: server RSS {rss_mb(proc.pid):.1f} MB")
    print(f"  {'wave':>4} {'accepted':>8} {'refused':>7} {'ended':>5} {'open':>5} {'RSS MB':>8}  refusal reason")
    still_open: list = []  # sockets the server never ended: kept open, as a hung client would
    rows = []
    try:
        for wave in range(1, args.waves + 1):
            held, reasons = [], []
            for i in range(args.clients):
                ws, reason = open_session(ws_url, seed=wave * 100 + i, steps=args.steps)
                (held.append(ws) if ws is not None else reasons.append(reason))
            deadline = time.monotonic() + 4 * args.session_timeout + 10
            codes = [ended_by_server(ws, deadline) for ws in held]
            still_open += [ws for ws, code in zip(held, codes) if code is None]
            time.sleep(0.2)  # let the server finish closing the envs it ended
            row = {"wave": wave, "accepted": len(held), "refused": len(reasons),
                   "ended": sum(code is not None for code in codes), "open": len(still_open),
                   "rss_mb": rss_mb(proc.pid), "codes": sorted({c for c in codes if c is not None})}
            rows.append(row)
            print(f"  {wave:>4} {row['accepted']:>8} {row['refused']:>7} {row['ended']:>5} {row['open']:>5} "
                  f"{row['rss_mb']:>8.1f}  {reasons[0] if reasons else '-'}", flush=True)
    finally:
        for ws in still_open:
            ws.close()
        proc.terminate()
        proc.wait(timeout=20)
    later = [r["rss_mb"] for r in rows[1:]] or [rows[0]["rss_mb"]]
    print(f"server RSS over waves 2..{len(rows)}: min {min(later):.1f} MB, max {max(later):.1f} MB, "
          f"spread {max(later) - min(later):.1f} MB; wave 1 {rows[0]['rss_mb']:.1f} MB; "
          f"close codes seen {sorted({c for r in rows for c in r['codes']})}; "
          f"sockets the server never ended: {len(still_open)}")
    return rows


if __name__ == "__main__":
    main()
