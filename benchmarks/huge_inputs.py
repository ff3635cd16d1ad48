"""Huge single inputs: peak RSS and step time for one 50 MiB BEAM message and one 10 MiB action.

    python benchmarks/huge_inputs.py [--message-mb 50] [--action-mb 10] [--seed 0]

Every case runs in a fresh Python process, so the peak RSS (``ru_maxrss``) of a case compares with the
baseline's like with like (same imports, same chat, same steps):

* ``baseline``: a synthetic 8,000-token chat in BEAM's layout, read through ``data_path=`` (tools mode,
  ``keep_snapshots=False``): make, reset, ``<next/>`` through every session, answer every question.
* ``message``: the same chat with its first message replaced by one of ``--message-mb`` MB (written to
  ``chat.json`` piece by piece, so the writer never holds it).
* ``action``: the baseline episode with, in the first session, three actions of ``--action-mb`` MB each: a
  ``<mem_add>`` of that size (over the store's budget), an unclosed ``<mem_add>`` and plain text; then the
  same sizes against MemQA-v0 (``<memory>`` of that size, unclosed ``<search>``).

Printed per case: the process's peak RSS, the growth of the peak RSS during the episode (from make on, Linux
VmHWM) over the baseline's, the size of the action texts the caller holds, the slowest step and the time of
make + reset. Target: growth within +100 MB and every step (and the reset) within 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

_PLACEHOLDER = "\u0001HUGE\u0001"
_WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit "


def write_chat(path: str, seed: int, message_bytes: int) -> None:
    """A synthetic chat in BEAM's layout under ``path``; with ``message_bytes`` its first message is that
    many bytes of words, streamed to the file in 1 MB pieces."""
    from tasks.beam import SyntheticBeamChat, write_beam_directory

    write_beam_directory(SyntheticBeamChat(seed, 8_000), path)
    if not message_bytes:
        return
    chat = os.path.join(path, "chat.json")
    with open(chat, encoding="utf-8") as f:
        batches = json.load(f)  # 8,000 tokens: small
    batches[0]["turns"][0][0]["content"] = _PLACEHOLDER
    head, tail = json.dumps(batches).split(json.dumps(_PLACEHOLDER)[1:-1])
    piece = (_WORDS * (2**20 // len(_WORDS) + 1))[: 2**20]
    with open(chat + ".tmp", "w", encoding="utf-8") as f:
        f.write(head)
        left = message_bytes
        while left > 0:
            f.write(piece[:left])
            left -= len(piece)
        f.write(tail)
    os.replace(chat + ".tmp", chat)


def _peak_mb() -> float:
    """The process's peak RSS since the last :func:`_restart_peak` (Linux: VmHWM), else since it started."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # pragma: no cover - not Linux
        return _peak_mb()


def _restart_peak() -> None:
    """Start the peak RSS afresh (Linux: writing 5 to clear_refs resets VmHWM); elsewhere a no-op."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover
        pass


def child(case: str, path: str, action_bytes: int) -> dict:
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the envs
    from memenv.envs.beam import MemDialogBeamEnv

    steps: list[float] = []

    def timed(env, action: str):
        start = time.perf_counter()
        out = env.step(action)
        steps.append(time.perf_counter() - start)
        return out

    MemDialogBeamEnv(chat_tokens=4_000)  # the shared Text space and imports, in every case alike
    huge = (_WORDS * (action_bytes // len(_WORDS) + 1))[:action_bytes] if case == "action" else ""
    actions = [f"<mem_add>{huge}</mem_add>", f"<mem_add>{huge}", huge] if huge else []
    qa_actions = [f"<memory>{huge}</memory><search>x</search>", f"<memory>m</memory><search>{huge}"] if huge else []
    process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _restart_peak()
    before = _rss_mb()  # the action texts above are the caller's: counted here, not in the growth
    start = time.perf_counter()
    env = MemDialogBeamEnv(data_path=path, keep_snapshots=False)
    env.reset(seed=0)
    setup = time.perf_counter() - start
    invalid = 0
    for action in actions:
        invalid += not timed(env, action)[4]["invocation"]["valid"]
    done = False
    while not done:
        phase = env.unwrapped._phase  # noqa: SLF001 - the benchmark drives the episode by phase
        action = "<next/>" if phase == "read" else "<answer>I do not know</answer>"
        _, _, terminated, truncated, _ = timed(env, action)
        done = terminated or truncated
    if qa_actions:  # the same sizes against the MemQA protocol (<memory> rewrite, <search>)
        qa = gym.make("MemQA-v0")
        qa.reset(seed=0)
        for action in qa_actions:
            invalid += not timed(qa, action)[4]["invocation"]["valid"]
    peak = _peak_mb()
    return {"case": case, "peak_rss_mb": max(peak, process_peak), "growth_mb": peak - before,
            "inputs_mb": (len(huge) + sum(map(len, actions + qa_actions))) / 2**20, "max_step_s": max(steps),
            "steps": len(steps), "setup_s": setup, "invalid": invalid}


def _host() -> str:
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:  # pragma: no cover - torch is optional here
        capability = "unknown (no torch)"
    return f"CPU capability {capability}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, single-threaded env"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--message-mb", type=float, default=50.0, help="size of the huge message, MiB")
    parser.add_argument("--action-mb", type=float, default=10.0, help="size of the huge actions, MiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        case, path, action_bytes = args.child
        print(json.dumps(child(case, path, int(action_bytes))))
        return []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plain, huge = os.path.join(tmp, "plain"), os.path.join(tmp, "huge")
        write_chat(plain, args.seed, 0)
        write_chat(huge, args.seed, int(args.message_mb * 2**20))
        action_bytes = int(args.action_mb * 2**20)
        for case, path in (("baseline", plain), ("message", huge), ("action", plain)):
            out = subprocess.run([sys.executable, __file__, "--child", case, path, str(action_bytes)],
                                 check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"MemDialog-BEAM-v0 (tools mode, data_path=, keep_snapshots=False): one message of {args.message_mb:g} MiB, "
          f"actions of {args.action_mb:g} MiB; one process per case")
    print(f"host: {_host()}")
    base = rows[0]["growth_mb"]
    print("peak RSS: the process's; growth: peak RSS during the episode over the RSS before make, less the "
          "baseline's (the action texts, held by the caller, are made before)")
    print(f"{'case':>9} {'peak RSS MiB':>13} {'growth MiB':>11} {'inputs MiB':>11} {'slowest step s':>15} "
          f"{'make+reset s':>13} {'steps':>6} {'invalid':>8}")
    for r in rows:
        print(f"{r['case']:>9} {r['peak_rss_mb']:>13.1f} {r['growth_mb'] - base:>+11.1f} {r['inputs_mb']:>11.1f} "
              f"{r['max_step_s']:>15.3f} {r['setup_s']:>13.2f} {r['steps']:>6} {r['invalid']:>8}")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
