"""Bad input fails fast and clearly: every env kwarg at make time, every malformed data file at load time.

Kwargs: ``gym.make`` raises ``ValueError`` (out of range) or ``TypeError`` (wrong type; also a ValueError,
see :class:`memenv.validation.ArgumentTypeError`) whose message names the parameter and what it accepts.
Files: every loader raises :class:`tasks.DataFormatError` naming the file and the record or line.
Actions: whatever text an agent sends, ``step`` never raises.
Commands (``memenv bench/train/distill`` after start-up: ``--out``, checkpoints, records files, Ctrl-C, failed
services, numeric options): ``tests/test_cli_failures.py``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the envs
from memenv.envs.base import MIN_BODY_TOKENS
from memenv.envs.memdialog import MemDialogEnv
from memenv.validation import ArgumentTypeError
from tasks import DataFormatError, DataFormatWarning
from tasks.beam import ABILITIES, iter_chat_batches, load_probing_questions
from tasks.conversations import QUESTION_TYPES, generate_conversation, min_questions_by_type
from tasks.corpus import load_corpus_jsonl, load_qa_pair, load_questions_jsonl
from tasks.hotpot import load_hotpotqa
from tasks.locomo import load_locomo
from tasks.longmemeval import write_synthetic_longmemeval
from tasks.world import build_world, objective_capacity

from conftest import TINY_HOTPOT, _tiny_locomo

# ------------------------------------------------------------------------------------------------ fixtures

CORPUS = [
    {"id": "d1", "title": "Velmora Records", "text": "Velmora Records was founded by Ilsa Brandt."},
    {"id": "d2", "title": "Ilsa Brandt", "text": "Ilsa Brandt was born in Tarsk."},
    {"id": "d3", "title": "Tarsk", "text": "Tarsk is a river town."},
]
QUESTIONS = [
    {"id": "q1", "question": "Where was the founder of Velmora Records born?", "answers": ["Tarsk"],
     "supporting_titles": ["Velmora Records", "Ilsa Brandt"]},
    {"id": "q2", "question": "Who founded Velmora Records?", "answers": ["Ilsa Brandt"], "supporting_ids": ["d1"]},
]


def _write_jsonl(path: Path, records: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A good data file of every kind: HotpotQA, corpus + questions pair, LoCoMo (two conversations)."""
    locomo = _tiny_locomo()
    second = copy.deepcopy(locomo[0])
    second["sample_id"] = "tiny-2"
    second["qa"] = second["qa"][:8]
    hotpot = tmp_path / "hotpot.json"
    hotpot.write_text(json.dumps(TINY_HOTPOT), encoding="utf-8")
    lo = tmp_path / "locomo.json"
    lo.write_text(json.dumps(locomo + [second]), encoding="utf-8")
    return {"hotpot": str(hotpot), "locomo": str(lo),
            "corpus": _write_jsonl(tmp_path / "corpus.jsonl", CORPUS),
            "questions": _write_jsonl(tmp_path / "questions.jsonl", QUESTIONS),
            "beam": _write_beam_folder(tmp_path / "beam"),
            "beam_release": str(Path(__file__).resolve().parent / "fixtures" / "beam_release"),
            "longmemeval": str(write_synthetic_longmemeval(tmp_path / "longmemeval.json", items=3, sessions=3,
                                                           turns=4, words=20))}


def _beam_message(i: int, role: str, content: str) -> dict:
    return {"role": role, "id": i, "index": f"1,{i}", "content": content, "time_anchor": "March-01-2024"}


BEAM_BATCHES = [
    {"batch_number": 1, "time_anchor": "March-01-2024",
     "turns": [[_beam_message(0, "user", "My sister's name is Maya."), _beam_message(1, "assistant", "Nice!")]]},
    {"batch_number": 2, "time_anchor": "March-05-2024",
     "turns": [[_beam_message(2, "user", "I woke up early, then ate lunch."), _beam_message(3, "assistant", "Good.")]]},
]
BEAM_QUESTIONS = {  # 3 questions; the second conversation adds 2 more (5)
    "information_extraction": [{"question": "What is my sister's name?", "answer": "Maya",
                                "rubric": ["LLM response should state: Maya"], "difficulty": "easy",
                                "source_chat_ids": [0]}],
    "event_ordering": [{"question": "Order?", "answer": "1. woke up\n2. ate lunch", "rubric": ["woke up"],
                        "difficulty": "hard"}],
    "abstention": [{"question": "What is my dog's name?", "ideal_response": "There is no information available.",
                    "rubric": ["says no information"], "difficulty": "medium"}],
}


def _write_beam_folder(root: Path) -> str:
    """BEAM's layout, two conversations: ``1`` (3 probing questions) and ``2`` (5)."""
    second = copy.deepcopy(BEAM_QUESTIONS)
    second["summarization"] = [{"question": "Sum up my day.", "ideal_summary": "Woke up early, ate lunch.",
                                "rubric": ["woke up early", "ate lunch"], "difficulty": "medium"},
                               {"question": "Sum up my family.", "ideal_summary": "A sister, Maya.",
                                "rubric": ["sister Maya"], "difficulty": "easy"}]
    for name, questions in (("1", BEAM_QUESTIONS), ("2", second)):
        (root / name / "probing_questions").mkdir(parents=True)
        (root / name / "chat.json").write_text(json.dumps(BEAM_BATCHES), encoding="utf-8")
        (root / name / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions),
                                                                                 encoding="utf-8")
    return str(root)


# Every registered env family, with the kwargs it needs to build from the fixture files.
ENVS = {
    "MemQA": ("MemQA-v0", {}),
    "MemQA-tools": ("MemQA-v0", {"memory_mode": "tools"}),
    "MemQA-N4": ("MemQA-N4-v0", {}),
    "Hotpot": ("MemQA-Hotpot-v0", {"data_path": "hotpot"}),
    "Pair": ("MemQA-v0", {"corpus_path": "corpus", "questions_path": "questions", "objectives": 1}),
    "MemRead": ("MemRead-v0", {"doc_tokens": 2000}),
    "MemDialog": ("MemDialog-v0", {}),
    "LoCoMo": ("MemDialog-LoCoMo-v0", {"data_path": "locomo", "questions": 2}),
    "BEAM": ("MemDialog-BEAM-v0", {}),
    "BEAM-rewrite": ("MemDialog-BEAM-v0", {"memory_mode": "rewrite"}),
    "BEAM-data": ("MemDialog-BEAM-v0", {"data_path": "beam"}),
    "BEAM-release": ("MemDialog-BEAM-v0", {"data_path": "beam_release"}),  # BEAM's official layout (our fixtures)
    "LongMemEval": ("MemDialog-LongMemEval-v0", {"data_path": "longmemeval"}),
}
BEAM_ENVS = ("BEAM", "BEAM-rewrite", "BEAM-data", "BEAM-release", "LongMemEval")
TOOLS_ENVS = ("BEAM", "BEAM-data", "BEAM-release", "LongMemEval", "MemQA-tools")  # tools: context="memory" only
QA_ENVS = ("MemQA", "MemQA-tools", "MemQA-N4", "MemRead")  # the synthetic world's QA knobs


def make(env: str, files: dict[str, str], **kwargs):
    env_id, base = ENVS[env]
    resolved = {k: files[v] if k in ("data_path", "corpus_path", "questions_path") else v for k, v in base.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checker's warnings are not the subject here
        return gym.make(env_id, **{**resolved, **kwargs})


def expect(env: str, files: dict[str, str], kwargs: dict, error: type, *fragments: str) -> str:
    """Make ``env`` with ``kwargs``; it must raise ``error`` naming every fragment. Returns the message."""
    with pytest.raises(error) as info:
        make(env, files, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


class Raising:
    def __call__(self, text: str) -> int:
        raise RuntimeError("tokenizer not loaded")


NAN, INF = float("nan"), float("inf")

# (kwargs, error, fragments the message must hold). Every env takes these.
COMMON_CASES = [
    ({"context": 5}, TypeError, ["context", "'memory'"]),
    ({"context": ["memory"]}, TypeError, ["context"]),
    ({"context": "bogus"}, ValueError, ["context", "'bogus'", "window:K"]),
    ({"context": "window:0"}, ValueError, ["context", "'window:0'"]),
    ({"context": "window:-3"}, ValueError, ["'window:-3'"]),
    ({"context": "window:two"}, ValueError, ["'window:two'"]),
    ({"context_budget": 0}, ValueError, ["context_budget", ">= 1"]),
    ({"context_budget": -5}, ValueError, ["context_budget"]),
    ({"context_budget": 300.0}, TypeError, ["context_budget", "an int"]),
    ({"context_budget": "800"}, TypeError, ["context_budget"]),
    ({"context_budget": True}, TypeError, ["context_budget", "bool"]),
    ({"context_budget": NAN}, TypeError, ["context_budget"]),
    ({"context_budget": 5}, ValueError, ["context_budget=5", "context_budget >="]),
    ({"token_counter": "words"}, TypeError, ["token_counter", "callable"]),
    ({"token_counter": 5}, TypeError, ["token_counter"]),
    ({"token_counter": lambda s: 1.5}, ValueError, ["token_counter", "1.5"]),
    ({"token_counter": lambda s: -1}, ValueError, ["token_counter", "-1"]),
    ({"token_counter": lambda s: s.split()}, ValueError, ["token_counter", "list"]),
    ({"token_counter": Raising()}, ValueError, ["token_counter", "tokenizer not loaded"]),
    ({"memory_budget": -1}, ValueError, ["memory_budget", ">= 0"]),
    ({"memory_budget": 2.5}, TypeError, ["memory_budget"]),
    ({"memory_budget": True}, TypeError, ["memory_budget"]),
    ({"memory_budget": "256"}, TypeError, ["memory_budget"]),
    ({"invalid_penalty": -1}, ValueError, ["invalid_penalty", ">= 0"]),
    ({"invalid_penalty": NAN}, ValueError, ["invalid_penalty", "finite"]),
    ({"invalid_penalty": INF}, ValueError, ["invalid_penalty", "finite"]),
    ({"invalid_penalty": "0.1"}, TypeError, ["invalid_penalty"]),
    ({"invalid_penalty": True}, TypeError, ["invalid_penalty"]),
    ({"render_mode": "human"}, ValueError, ["render_mode", "'human'", "'ansi'"]),
]

# The knobs of the QA task and the synthetic world (MemQA, MemRead).
QA_CASES = [
    ({"objectives": 0}, ValueError, ["objectives", ">= 1"]),
    ({"objectives": -1}, ValueError, ["objectives"]),
    ({"objectives": True}, TypeError, ["objectives", "bool"]),
    ({"objectives": 1.5}, TypeError, ["objectives"]),
    ({"objectives": "2"}, TypeError, ["objectives"]),
    ({"objectives": NAN}, TypeError, ["objectives"]),
    ({"objectives": 10**6}, ValueError, ["objectives=1000000", "corpus_size=1200", "at most"]),
    ({"objectives": 600}, ValueError, ["objectives=600", "at most"]),
    ({"hops": 0}, ValueError, ["hops", "[1, 6]"]),
    ({"hops": 7}, ValueError, ["hops"]),
    ({"hops": True}, TypeError, ["hops"]),
    ({"hops": 2.0}, TypeError, ["hops"]),
    ({"hops": "2"}, TypeError, ["hops"]),
    ({"hops": ()}, ValueError, ["hops"]),
    ({"hops": (2, 9)}, ValueError, ["hops"]),
    ({"hops": [2, True]}, TypeError, ["hops"]),
    ({"corpus_size": 10}, ValueError, ["corpus_size", "[50, 1000000]"]),
    ({"corpus_size": 10**9}, ValueError, ["corpus_size"]),
    ({"corpus_size": 1e3}, TypeError, ["corpus_size"]),
    ({"corpus_size": True}, TypeError, ["corpus_size"]),
    ({"lookalike_rate": -0.1}, ValueError, ["lookalike_rate", "[0, 1]"]),
    ({"lookalike_rate": 2.0}, ValueError, ["lookalike_rate", "[0, 1]"]),
    ({"lookalike_rate": NAN}, ValueError, ["lookalike_rate"]),
    ({"lookalike_rate": "0.3"}, TypeError, ["lookalike_rate"]),
    ({"comparison_rate": 1.5}, ValueError, ["comparison_rate", "[0, 1]", "1.5"]),
    ({"comparison_rate": -0.01}, ValueError, ["comparison_rate"]),
    ({"comparison_rate": INF}, ValueError, ["comparison_rate"]),
    ({"comparison_rate": True}, TypeError, ["comparison_rate"]),
    ({"distractors": -1}, ValueError, ["distractors", "[0, 100]"]),
    ({"distractors": 10**6}, ValueError, ["distractors"]),
    ({"distractors": 1.5}, TypeError, ["distractors"]),
    ({"distractors": True}, TypeError, ["distractors"]),
    ({"world_seed": -1}, ValueError, ["world_seed", ">= 0"]),
    ({"world_seed": 1.5}, TypeError, ["world_seed"]),
    ({"world_seed": "0"}, TypeError, ["world_seed"]),
    ({"world_seed": True}, TypeError, ["world_seed"]),
    ({"world_seed": None}, TypeError, ["world_seed"]),
    ({"dataset": "wiki"}, ValueError, ["dataset", "'wiki'", "'synthetic'", "'hotpotqa'"]),
    ({"dataset": 3}, TypeError, ["dataset"]),
    ({"dataset": "hotpotqa"}, ValueError, ["data_path"]),
    ({"data_path": 5}, TypeError, ["data_path", "path"]),
    ({"data_path": ""}, ValueError, ["data_path"]),
    ({"data_path": "/nonexistent/hotpot.json"}, FileNotFoundError, ["data_path", "/nonexistent/hotpot.json"]),
    ({"data_limit": 0}, ValueError, ["data_limit"]),
    ({"data_limit": True}, TypeError, ["data_limit"]),
    ({"corpus_path": "/nonexistent/c.jsonl"}, ValueError, ["questions_path"]),
    ({"corpus_path": 3, "questions_path": 4}, TypeError, ["corpus_path"]),
    ({"source": object()}, TypeError, ["source", "sample_questions"]),
    ({"max_turns": 0}, ValueError, ["max_turns", ">= 1"]),
    ({"max_turns": True}, TypeError, ["max_turns"]),
    ({"max_turns": 2.5}, TypeError, ["max_turns"]),
]

MEMQA_CASES = [
    ({"top_k": 0}, ValueError, ["top_k", ">= 1"]),
    ({"top_k": True}, TypeError, ["top_k"]),
    ({"top_k": 1.5}, TypeError, ["top_k"]),
    ({"search_backend": "faiss"}, ValueError, ["search_backend", "'faiss'", "'bm25'", "'rank_bm25'"]),
    ({"search_backend": None}, TypeError, ["search_backend"]),
]

MEMREAD_CASES = [
    ({"doc_tokens": 0}, ValueError, ["doc_tokens", "[1, 100000000]"]),
    ({"doc_tokens": 10**12}, ValueError, ["doc_tokens", "100000000"]),
    ({"doc_tokens": 8000.0}, TypeError, ["doc_tokens"]),
    ({"doc_tokens": True}, TypeError, ["doc_tokens"]),
    ({"chunk_tokens": 8}, ValueError, ["chunk_tokens", ">= 16"]),
    ({"chunk_tokens": "512"}, TypeError, ["chunk_tokens"]),
    ({"chunk_tokens": True}, TypeError, ["chunk_tokens"]),
    ({"keep_snapshots": "yes"}, TypeError, ["keep_snapshots", "True, False or a whole number"]),
    ({"keep_snapshots": 2.5}, TypeError, ["keep_snapshots"]),
    ({"keep_snapshots": None}, TypeError, ["keep_snapshots"]),
]

DIALOG_CASES = [
    ({"questions": 0}, ValueError, ["questions", ">= 1"]),
    ({"questions": True}, TypeError, ["questions", "bool"]),
    ({"questions": 2.5}, TypeError, ["questions"]),
    ({"questions": "5"}, TypeError, ["questions"]),
    ({"sessions": 0}, ValueError, ["sessions"]),
    ({"sessions": True}, TypeError, ["sessions"]),
    ({"sessions": 1.5}, TypeError, ["sessions"]),
    ({"sessions": 10**6}, ValueError, ["sessions", "1000"]),
    ({"turns_per_session": 3}, ValueError, ["turns_per_session", "[4, 1000]"]),
    ({"turns_per_session": True}, TypeError, ["turns_per_session"]),
    ({"turns_per_session": 20.0}, TypeError, ["turns_per_session"]),
    ({"max_turns": 0}, ValueError, ["max_turns"]),
    ({"max_turns": False}, TypeError, ["max_turns"]),
    ({"dataset": "beam"}, ValueError, ["dataset", "'beam'", "'synthetic'", "'locomo'"]),
    ({"data_path": 7}, TypeError, ["data_path"]),
    ({"question_types": 5}, TypeError, ["question_types"]),
    ({"question_types": []}, ValueError, ["question_types", "at least one"]),
    ({"question_types": [1]}, TypeError, ["question_types"]),
    ({"questions_upfront": "no"}, TypeError, ["questions_upfront", "True or False"]),
    ({"questions_upfront": 0}, TypeError, ["questions_upfront"]),
    ({"keep_snapshots": 2.5}, TypeError, ["keep_snapshots"]),
    ({"conversation": True}, TypeError, ["conversation"]),
    ({"conversation": -1}, ValueError, ["conversation"]),
]

SYNTHETIC_DIALOG_CASES = [
    ({"sessions": 1}, ValueError, ["sessions", ">= 2"]),
    ({"questions": 10**6}, ValueError, ["questions=1000000", "sessions=8", "at most 32"]),
    ({"questions": 33}, ValueError, ["questions=33", "at most 32"]),
    ({"questions": 9, "sessions": 2, "question_types": ["temporal", "multi-hop"]}, ValueError,
     ["questions=9", "sessions=2", "at most 8"]),
    ({"question_types": ("temporal",), "questions": 13}, ValueError, ["questions=13", "at most 12"]),
    ({"question_types": "temporal"}, TypeError, ["question_types", "('temporal',)"]),
    ({"question_types": ["temporal", "bogus"]}, ValueError,
     ["question_types", "'bogus'", *(repr(t) for t in QUESTION_TYPES)]),
    ({"question_types": ["adversarial"]}, ValueError, ["question_types", "'adversarial'"]),
    ({"conversation": 0}, ValueError, ["conversation", "data_path"]),
]

LOCOMO_CASES = [
    ({"conversation": 2}, ValueError, ["conversation", "0..1"]),
    ({"questions": 10}, ValueError, ["questions=10", "at most 8"]),
    ({"conversation": 0, "questions": 13}, ValueError, ["questions=13", "at most 12"]),
    ({"sessions": 3}, ValueError, ["sessions", "at most 2"]),
    ({"question_types": ["knowledge-update"]}, ValueError,
     ["question_types", "'knowledge-update'", "'adversarial'", "'single-hop'"]),
    ({"question_types": "temporal"}, TypeError, ["question_types", "('temporal',)"]),
    ({"question_types": ["temporal"], "questions": 2}, ValueError, ["questions=2", "at most 1"]),
    ({"data_path": "/nonexistent/locomo.json"}, FileNotFoundError, ["data_path", "/nonexistent/locomo.json"]),
]

PAIR_CASES = [
    ({"objectives": 3}, ValueError, ["objectives=3", "at most 2", "questions_path"]),
    ({"dataset": "hotpotqa"}, ValueError, ["corpus_path", "dataset='hotpotqa'"]),
    ({"questions_path": None}, ValueError, ["corpus_path", "questions_path"]),
]

HOTPOT_CASES = [
    ({"objectives": 5}, ValueError, ["objectives=5", "at most 4", "data_path"]),
    ({"objectives": 3, "data_limit": 2}, ValueError, ["objectives=3", "at most 2", "data_limit=2"]),
    ({"data_path": None}, ValueError, ["MemQA-Hotpot-v0 needs data_path="]),
]

# MemDialog-BEAM, every task source (synthetic tools and rewrite, BEAM's layout).
BEAM_CASES = [
    ({"questions": 0}, ValueError, ["questions", ">= 1"]),
    ({"questions": True}, TypeError, ["questions", "bool"]),
    ({"questions": 2.5}, TypeError, ["questions"]),
    ({"questions": "5"}, TypeError, ["questions"]),
    ({"questions": NAN}, TypeError, ["questions"]),
    ({"search_k": 0}, ValueError, ["search_k", ">= 1"]),
    ({"search_k": True}, TypeError, ["search_k"]),
    ({"search_k": 1.5}, TypeError, ["search_k"]),
    ({"search_k": None}, TypeError, ["search_k"]),
    ({"max_tool_calls": 0}, ValueError, ["max_tool_calls", ">= 1"]),
    ({"max_tool_calls": True}, TypeError, ["max_tool_calls"]),
    ({"max_tool_calls": "256"}, TypeError, ["max_tool_calls"]),
    ({"max_tool_calls": INF}, TypeError, ["max_tool_calls"]),
    ({"max_turns": 0}, ValueError, ["max_turns", ">= 1"]),
    ({"max_turns": False}, TypeError, ["max_turns"]),
    ({"max_turns": 2.5}, TypeError, ["max_turns"]),
    ({"memory_budget": NAN}, TypeError, ["memory_budget"]),
    ({"memory_mode": "vector"}, ValueError, ["memory_mode", "'vector'", "'rewrite'", "'tools'"]),
    ({"memory_mode": None}, TypeError, ["memory_mode"]),
    ({"dataset": "hotpotqa"}, ValueError, ["dataset", "'hotpotqa'", "'beam'", "'memdialog'", "'locomo'"]),
    ({"dataset": 3}, TypeError, ["dataset"]),
    ({"abilities": "summarization"}, TypeError, ["abilities", "('summarization',)"]),
    ({"abilities": ["summarization", "telepathy"]}, ValueError,
     ["abilities", "'telepathy'", *(repr(a) for a in ABILITIES)]),
    ({"abilities": ["single-hop"]}, ValueError, ["abilities", "'single-hop'", "'temporal_reasoning'"]),
    ({"abilities": []}, ValueError, ["abilities", "at least one"]),
    ({"abilities": [1]}, TypeError, ["abilities"]),
    ({"abilities": 5}, TypeError, ["abilities"]),
    ({"show_store": "yes"}, TypeError, ["show_store", "True or False"]),
    ({"show_store": 1}, TypeError, ["show_store"]),
    ({"refine_strategy": 1}, TypeError, ["refine_strategy", "True or False"]),
    ({"refine_strategy": None}, TypeError, ["refine_strategy"]),
    ({"keep_snapshots": 0}, TypeError, ["keep_snapshots"]),
    ({"judge": 5}, TypeError, ["judge", "openai:MODEL@URL"]),
    ({"judge": "gpt@localhost"}, ValueError, ["judge", "openai:MODEL@URL"]),
    ({"judge": "openai:m@ftp://host"}, ValueError, ["judge", "http"]),
    ({"strategy": 5}, TypeError, ["strategy", "string"]),
    ({"strategy": None}, TypeError, ["strategy"]),
    ({"conversation": True}, TypeError, ["conversation"]),
    ({"conversation": -1}, ValueError, ["conversation", ">= 0"]),
    ({"conversation": 1.0}, TypeError, ["conversation"]),
    ({"sessions": True}, TypeError, ["sessions"]),
    ({"sessions": 2.0}, TypeError, ["sessions"]),
    ({"data_path": 7}, TypeError, ["data_path", "path"]),
    ({"data_path": ""}, ValueError, ["data_path"]),
    ({"data_path": "/nonexistent/beam"}, FileNotFoundError, ["data_path", "/nonexistent/beam"]),
]

# MemQA's memory modes: the tools knobs, and the same knobs refused by the rewrite protocol.
MEMQA_TOOLS_CASES = [
    ({"memory_mode": "vector"}, ValueError, ["memory_mode", "'vector'", "'rewrite'", "'tools'"]),
    ({"memory_mode": None}, TypeError, ["memory_mode"]),
    ({"search_k": 0}, ValueError, ["search_k", ">= 1"]),
    ({"search_k": True}, TypeError, ["search_k"]),
    ({"search_k": 1.5}, TypeError, ["search_k"]),
    ({"show_store": "yes"}, TypeError, ["show_store", "True or False"]),
    ({"show_store": 1}, TypeError, ["show_store"]),
]
MEMQA_REWRITE_CASES = [
    ({"memory_mode": "vector"}, ValueError, ["memory_mode", "'rewrite'", "'tools'"]),
    ({"search_k": 4}, ValueError, ["search_k=4", "memory_mode='tools' only", "memory_mode='rewrite'"]),
    ({"show_store": False}, ValueError, ["show_store=False", "memory_mode='tools' only"]),
]

TOOLS_CASES = [
    ({"context": "history"}, ValueError, ["memory_mode='tools'", "context='memory'", "'history'"]),
    ({"context": "none"}, ValueError, ["memory_mode='tools'", "context='memory'"]),
]

SYNTHETIC_BEAM_CASES = [
    ({"questions": 10**6}, ValueError, ["questions=1000000", "questions_per_ability=2", "at most 20"]),
    ({"questions": 21}, ValueError, ["questions=21", "at most 20"]),
    ({"questions_per_ability": 1, "questions": 11}, ValueError, ["questions=11", "at most 10"]),
    ({"abilities": ["abstention", "summarization"], "questions": 5}, ValueError,
     ["questions=5", "abilities=('abstention', 'summarization')", "at most 4"]),
    ({"chat_tokens": 100}, ValueError, ["chat_tokens", "[4000, 100000000]", "100"]),
    ({"chat_tokens": 10**12}, ValueError, ["chat_tokens", "100000000"]),
    ({"chat_tokens": 8000.0}, TypeError, ["chat_tokens"]),
    ({"chat_tokens": True}, TypeError, ["chat_tokens", "bool"]),
    ({"chat_tokens": NAN}, TypeError, ["chat_tokens"]),
    ({"chat_tokens": INF}, TypeError, ["chat_tokens"]),
    ({"questions_per_ability": 0}, ValueError, ["questions_per_ability", "[1, 4]"]),
    ({"questions_per_ability": 5}, ValueError, ["questions_per_ability", "[1, 4]"]),
    ({"questions_per_ability": True}, TypeError, ["questions_per_ability"]),
    ({"conversation": 0}, ValueError, ["conversation", "data_path"]),
    ({"sessions": 4}, ValueError, ["sessions=4", "dataset='memdialog'", "no effect"]),
    ({"sessions": 1}, ValueError, ["sessions", "[2, 1000]"]),
    ({"dataset": "locomo"}, ValueError, ["data_path", "LoCoMo"]),
    ({"dataset": "memdialog", "sessions": 10**6}, ValueError, ["sessions", "1000"]),
    ({"dataset": "memdialog", "questions": 10**6}, ValueError, ["questions=1000000", "sessions=8", "at most 32"]),
    ({"dataset": "memdialog", "abilities": ["summarization"]}, ValueError,
     ["abilities", "'summarization'", *(repr(t) for t in QUESTION_TYPES)]),
    ({"dataset": "memdialog", "chat_tokens": 8000}, ValueError, ["chat_tokens=8000", "synthetic chats"]),
    ({"dataset": "memdialog", "conversation": 0}, ValueError, ["dataset='memdialog'", "conversation="]),
]

BEAM_DATA_CASES = [
    ({"conversation": 2}, ValueError, ["conversation", "0..1", "holds 2"]),
    ({"questions": 4}, ValueError, ["questions=4", "every conversation of", "at most 3"]),
    ({"conversation": 1, "questions": 6}, ValueError, ["questions=6", "conversation 1 of", "at most 5"]),
    ({"abilities": ["summarization"]}, ValueError, ["no question left", "abilities=('summarization',)"]),
    ({"abilities": ["abstention"], "questions": 2}, ValueError, ["questions=2", "at most 1"]),
    ({"chat_tokens": 8000}, ValueError, ["chat_tokens=8000", "synthetic chats", "data_path="]),
    ({"questions_per_ability": 1}, ValueError, ["questions_per_ability=1", "synthetic chats"]),
    ({"dataset": "memdialog"}, ValueError, ["dataset='memdialog'", "data_path="]),
]


LONGMEMEVAL_CASES = [
    ({"abilities": "multi-session"}, TypeError, ["abilities", "('multi-session',)"]),
    ({"abilities": ["multi-session", "telepathy"]}, ValueError, ["abilities", "'telepathy'", "'temporal-reasoning'"]),
    ({"abilities": ["summarization"]}, ValueError, ["abilities", "'summarization'", "'knowledge-update'"]),
    ({"abilities": ["multi-session"]}, ValueError, ["no item of", "abilities=('multi-session',)"]),
    ({"abilities": []}, ValueError, ["abilities", "at least one"]),
    ({"questions": 2}, ValueError, ["questions=2", "one question each", "at most 1"]),
    ({"conversation": 3}, ValueError, ["conversation", "0..2", "holds 3"]),
    ({"chat_tokens": 8000}, ValueError, ["chat_tokens=8000", "synthetic chats"]),
    ({"sessions": 4}, ValueError, ["sessions=4", "dataset='memdialog'"]),
    ({"data_path": None}, ValueError, ["MemDialog-LongMemEval-v0 needs data_path="]),
]


def _battery() -> list:
    cases = []
    for env in ENVS:
        family = [*COMMON_CASES]
        if env in QA_ENVS:
            family += QA_CASES
        if env in ("MemQA", "MemQA-tools", "MemQA-N4", "Hotpot", "Pair"):
            family += MEMQA_CASES
        if env == "MemQA-tools":
            family += MEMQA_TOOLS_CASES
        if env in ("MemQA", "Hotpot"):
            family += MEMQA_REWRITE_CASES
        if env == "MemRead":
            family += MEMREAD_CASES
        if env in ("MemDialog", "LoCoMo"):
            family += DIALOG_CASES
        if env in BEAM_ENVS:  # LongMemEval's abilities are its question types (LONGMEMEVAL_CASES)
            family += [c for c in BEAM_CASES if env != "LongMemEval" or "abilities" not in c[0]]
        if env in TOOLS_ENVS:
            family += TOOLS_CASES
        family += {"MemDialog": SYNTHETIC_DIALOG_CASES, "LoCoMo": LOCOMO_CASES, "Pair": PAIR_CASES,
                   "Hotpot": HOTPOT_CASES, "BEAM": SYNTHETIC_BEAM_CASES, "BEAM-rewrite": SYNTHETIC_BEAM_CASES,
                   "BEAM-data": BEAM_DATA_CASES, "LongMemEval": LONGMEMEVAL_CASES}.get(env, [])
        for kwargs, error, fragments in family:
            # the id without memory addresses: the same in every process (pytest-xdist's workers compare them)
            label = re.sub(r" at 0x[0-9a-fA-F]+", "", f"{env}-{kwargs!r}")[:90]
            cases.append(pytest.param(env, kwargs, error, fragments, id=label))
    return cases


@pytest.mark.parametrize("env, kwargs, error, fragments", _battery())
def test_bad_kwarg_fails_at_make_naming_it(files, env: str, kwargs: dict, error: type, fragments: list) -> None:
    expect(env, files, kwargs, error, *fragments)


@pytest.mark.parametrize("env", list(ENVS))
def test_good_kwargs_at_the_boundaries_are_accepted(files, env: str) -> None:
    """The checks are not stricter than the ranges they state."""
    bounds = {"memory_budget": 0, "invalid_penalty": 0, "context": "window:1", "max_turns": 1}
    if env in TOOLS_ENVS:
        bounds["context"] = "memory"
    if env in BEAM_ENVS:
        bounds.update(questions=None, search_k=1, max_tool_calls=1, show_store=True, refine_strategy=True,
                      judge=None, strategy="", abilities=("abstention", "event_ordering"))
    if env in ("BEAM", "BEAM-rewrite"):
        bounds.update(chat_tokens=4000, questions_per_ability=4, questions=2 * 4)
    if env == "BEAM-data":
        bounds.update(conversation=1, questions=2)
    if env == "BEAM-release":
        bounds.update(conversation=2, questions=4)
    if env == "LongMemEval":
        bounds.update(conversation=0, questions=1, abilities=("single-session-user",))
    if env == "MemQA-tools":
        bounds.update(search_k=1, show_store=False)
    if env in QA_ENVS:
        bounds.update(comparison_rate=1.0, lookalike_rate=0, hops=[1, 6], distractors=0, world_seed=2**40,
                      objectives=np.int64(1), corpus_size=50)
    if env in ("MemDialog", "LoCoMo"):
        bounds.update(questions=None, question_types=("temporal", "single-hop"), questions_upfront=False)
    env_ = make(env, files, **bounds)
    obs, info = env_.reset(seed=0)
    assert env_.observation_space.contains(obs)


def test_render_mode_of_wrong_type_names_it() -> None:
    # gym.make itself calls str methods on render_mode before the env sees it, so build the env directly.
    with pytest.raises(TypeError, match="render_mode must be one of 'ansi' or None, got 1"):
        MemDialogEnv(render_mode=1)


def test_type_errors_are_also_value_errors() -> None:
    # Code written against the old ValueError keeps catching a wrongly typed kwarg.
    with pytest.raises(ValueError):
        gym.make("MemQA-v0", objectives="2")
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


# ------------------------------------------------------------------------------ a refused reset poisons nothing

BAD_SEEDS = [(-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError), ([1], TypeError)]


def _play(env, seed: int, actions: list[str]) -> list:
    obs, info = env.reset(seed=seed)
    steps = [obs]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs, reward, terminated, truncated, info["invocation"].get("valid")))
    return steps


@pytest.mark.parametrize("env", ["MemQA", "MemQA-tools", "MemRead", "MemDialog", "BEAM", "LongMemEval"])
def test_a_bad_seed_is_refused_and_never_poisons_the_env(env: str, files) -> None:
    # Gymnasium's checker marked its first reset as checked before calling it: a first reset that raised left
    # every later step failing ("cannot unpack non-iterable NoneType object"). Every bad seed, first or not.
    actions = ["<memory>notes</memory><search>founder</search>" if env in ("MemQA", "MemDialog") else "<next/>",
               "<mem_add>a note</mem_add>"]
    reference = _play(make(env, files), 0, actions)
    played = make(env, files)
    for seed, error in BAD_SEEDS:
        with pytest.raises(error, match=r"^seed must be an int >= 0 or None, got "):
            played.reset(seed=seed)
    assert _play(played, 0, actions) == reference
    # mid-episode: the refused reset leaves the episode in progress as it was
    played.reset(seed=0)
    played.step(actions[0])
    with pytest.raises(ValueError, match="seed"):
        played.reset(seed=-1)
    obs, *_ = played.step(actions[1])
    assert obs == reference[2][0]


def test_a_bad_seed_is_refused_with_gymnasiums_own_checker_and_without_any() -> None:
    for kwargs in ({"disable_env_checker": False}, {"disable_env_checker": True}):
        env = gym.make("MemQA-v0", **kwargs)
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            env.reset(seed=-1)
        env.reset(seed=np.int64(3))  # numpy integers are seeds too
        assert env.step("<answer>x</answer>")[4]["invocation"]["turn"] == 1
    raw = MemDialogEnv()  # no gym.make: the env itself refuses
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        raw.reset(seed=-7)
    raw.reset(seed=0)
    with pytest.raises(TypeError, match="options must be a dict or None, got list"):
        gym.make("MemDialog-v0").reset(options=[1])


def test_the_env_checker_is_memenvs_and_survives_a_spec_round_trip() -> None:
    env = gym.make("MemQA-v0", objectives=2)
    assert [w.name for w in env.spec.additional_wrappers] == ["EnvChecker"]
    again = gym.make(env.spec)
    assert str(again) == str(env) and again.unwrapped.objectives == 2
    with pytest.raises(ValueError, match="seed"):
        again.reset(seed=-1)
    again.reset(seed=0)
    again.step("<answer>x</answer>")


# ------------------------------------------------------------------------------ caches key on every file read

def test_an_edited_probing_questions_file_is_seen_by_the_next_make(tmp_path) -> None:
    # The conversation cache keyed on chat.json only: an edited probing_questions.json was ignored.
    folder = Path(_write_beam_folder(tmp_path / "beam")) / "1"
    first = gym.make("MemDialog-BEAM-v0", data_path=str(folder), abilities=("information_extraction",))
    assert first.reset(seed=0)[1]["questions"] == ["What is my sister's name?"]
    questions_file = folder / "probing_questions" / "probing_questions.json"
    edited = copy.deepcopy(BEAM_QUESTIONS)
    edited["information_extraction"][0]["question"] = "What is my brother's name?"
    questions_file.write_text(json.dumps(edited), encoding="utf-8")
    again = gym.make("MemDialog-BEAM-v0", data_path=str(folder), abilities=("information_extraction",))
    assert again.reset(seed=0)[1]["questions"] == ["What is my brother's name?"]


def test_a_file_replaced_with_its_size_and_mtime_kept_is_loaded_again(files, tmp_path) -> None:
    # mtime alone (or mtime and size) misses a same-size file copied over with its mtime kept (cp -p, rsync -t).
    env = make("Pair", files)
    assert env.reset(seed=0)[1]["questions"][0] in {q["question"] for q in QUESTIONS}
    path = Path(files["questions"])
    before = path.stat()
    changed = [dict(q, question=q["question"].replace("Velmora", "Velmoxa")) for q in QUESTIONS]
    replacement = tmp_path / "replacement.jsonl"
    _write_jsonl(replacement, changed)
    assert replacement.stat().st_size == before.st_size
    replacement.replace(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    texts = {make("Pair", files).reset(seed=seed)[1]["questions"][0] for seed in range(6)}
    assert texts <= {q["question"] for q in changed} and any("Velmoxa" in t for t in texts)


def test_a_missing_questions_path_names_the_file() -> None:
    # Was a 13-line traceback ending in getmtime's bare "[Errno 2] No such file or directory".
    with pytest.raises(FileNotFoundError, match="questions file not found: 'missing.jsonl'"):
        gym.make("MemQA-v0", questions_path="missing.jsonl", search_backend="http://127.0.0.1:9/retrieve")
    with pytest.raises(ValueError, match="needs both corpus_path= and questions_path="):
        gym.make("MemQA-v0", questions_path="missing.jsonl")


# ------------------------------------------------------------------------------ capacities are truthful

@pytest.mark.parametrize("corpus_size, hops, rate", [(200, 2, 0.25), (50, 1, 0.0), (120, (1, 3), 1.0), (50, 6, 1.0)])
def test_objective_capacity_is_reachable_and_enforced(corpus_size: int, hops, rate: float) -> None:
    capacity = objective_capacity(corpus_size, hops, rate)
    assert capacity >= 1
    env = gym.make("MemQA-v0", objectives=capacity, hops=hops, comparison_rate=rate, corpus_size=corpus_size)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        assert len(info["questions"]) == capacity
    with pytest.raises(ValueError, match=f"at most {capacity} objectives"):
        gym.make("MemQA-v0", objectives=capacity + 1, hops=hops, comparison_rate=rate, corpus_size=corpus_size)


def test_objective_capacity_leaves_room_below_what_greedy_draws_reach() -> None:
    # The default world: 2-hop objectives need 2 documents each, comparisons 4; a quarter of the corpus.
    assert objective_capacity(1200, 2, 0.25) == 120
    world = build_world(200, 0.3, 3, 0)
    questions = world.sample_questions(np.random.default_rng(0), 2 * objective_capacity(200, 2, 0.25), 2, 0.25)
    assert len({d for q in questions for d in q.supporting_ids}) == sum(len(q.supporting_ids) for q in questions)


@pytest.mark.parametrize("sessions", [2, 3, 8])
def test_min_questions_by_type_is_a_tight_lower_bound(sessions: int) -> None:
    minimum = min_questions_by_type(sessions)
    assert set(minimum) == set(QUESTION_TYPES)
    fewest = dict.fromkeys(QUESTION_TYPES, math.inf)
    for seed in range(40):
        conv = generate_conversation(np.random.default_rng(seed), sessions, 4)
        for kind in QUESTION_TYPES:
            count = sum(q.kind == kind for q in conv.questions)
            assert count >= minimum[kind], (seed, kind)
            fewest[kind] = min(fewest[kind], count)
    assert fewest == minimum  # some conversation attains each bound


def test_dialog_questions_at_capacity_are_all_asked() -> None:
    holds = sum(min_questions_by_type(2).values())
    env = MemDialogEnv(questions=holds, sessions=2, turns_per_session=4)
    for seed in range(5):
        _, info = env.reset(seed=seed)
        assert len(info["questions"]) == holds  # nothing silently cut


# ---------------------------------------------------------------------------------------- context budget

def _minimum_budget(env: str, files, **kwargs) -> int:
    message = expect(env, files, {"context_budget": 1, **kwargs}, ValueError, "context_budget=1")
    return int(re.search(r"context_budget >= (\d+)", message).group(1))


@pytest.mark.parametrize("env", list(ENVS))
def test_context_budget_minimum_is_exact_and_keeps_every_question(files, env: str) -> None:
    need = _minimum_budget(env, files)
    assert need > MIN_BODY_TOKENS
    expect(env, files, {"context_budget": need - 1}, ValueError, f"context_budget >= {need}")
    made = make(env, files, context_budget=need, context="memory" if env in TOOLS_ENVS else "history")
    obs, info = made.reset(seed=0)
    if env in BEAM_ENVS:  # BEAM's probing questions come after the chat: the task block says how many
        assert f"asked {len(info['questions'])} question(s)" in obs
    else:  # every other env lists its questions up front by default
        for i in range(1, len(info["questions"]) + 1):
            assert f"Question {i}:" in obs
    # The task block survives every step, even when the body is cut to the minimum.
    for _ in range(3):
        obs, _, terminated, truncated, step = made.step("<memory>" + "word " * 500 + "</memory>")
        assert obs.startswith(made.unwrapped._task_block())
        if terminated or truncated:
            break


def test_context_budget_minimum_grows_with_the_objectives(files) -> None:
    assert _minimum_budget("MemQA", files, objectives=16) > _minimum_budget("MemQA", files, objectives=1)


# -------------------------------------------------------------------------------------- fuzzed actions

NASTY_ACTIONS = [
    "", " ", "\x00", "\ud800", "💥" * 50, "<memory>", "</memory>", "<memory><memory>x</memory></memory>",
    "<answer>", "<answer></answer>", "<search></search>", "<memory>m</memory><search>" + "q " * 5000 + "</search>",
    "<memory>m</memory><answer>" + ";" * 1000 + "</answer>", "<think>" * 100, "<memory>" + "x" * 200_000,
    "<MEMORY>m</MEMORY><ANSWER>a</ANSWER>", "<memory>m</memory><answer>a</answer><answer>b</answer>",
    "<memory>m</memory><tool>x</tool>", "\n" * 1000, "<memory>\u2028</memory><search>\u2029</search>",
    # the memory-tools protocol (MemDialog-BEAM): unknown ids, huge ids and texts, calls glued or unclosed
    "<next/>", "<next/><next/>", "<mem_add>x</mem_add>", "<mem_add></mem_add>", "<mem_add>" + "w " * 50_000 + "</mem_add>",
    "<mem_update id=99999999999999999999999>x</mem_update>", "<mem_update id=-1>x</mem_update>",
    "<mem_update id=1>", "<mem_delete id=1/>", "<mem_delete id=x/>", "<mem_delete/>", "<mem_search></mem_search>",
    "<mem_search>" + "q " * 5000 + "</mem_search>", "<think>t</think><mem_search>sister</mem_search>",
    "<mem_add>a</mem_add><mem_add>b</mem_add>", "<strategy>keep dates</strategy>", "<strategy></strategy>",
    "<answer>Maya</answer>", "<mem_add>\x00\ud800</mem_add>",
]


FUZZ_ENVS = ("MemQA", "MemQA-tools", "MemRead", "MemDialog", "LoCoMo", *BEAM_ENVS)


@pytest.mark.parametrize("env, context", [(env, context) for env in FUZZ_ENVS
                                          for context in ("memory", "none") if context == "memory" or env not in TOOLS_ENVS])
def test_env_never_raises_on_action_text(files, env: str, context: str) -> None:
    made = make(env, files, context=context, max_turns=8)
    rng = np.random.default_rng(0)
    made.reset(seed=0)
    for i in range(60):
        action = NASTY_ACTIONS[int(rng.integers(len(NASTY_ACTIONS)))] if i % 3 else \
            "".join(chr(int(c)) for c in rng.integers(0, 0x10FFFF, size=40) if not 0xD800 <= c < 0xE000)
        obs, reward, terminated, truncated, info = made.step(action)
        assert made.observation_space.contains(obs) and math.isfinite(reward)
        if terminated or truncated:
            made.reset(seed=i)


# Valid somewhere in a BEAM episode (either memory mode), so that the fuzz gets past the reading phase.
PROGRESS_ACTIONS = ["<next/>", "<memory>m</memory>", "<memory>m</memory><answer>a</answer>", "<answer>a</answer>",
                    "<strategy>s</strategy>"]


@pytest.mark.parametrize("env", BEAM_ENVS)
def test_beam_fuzz_through_every_phase_never_raises(files, env: str) -> None:
    """Fuzzed actions in reading, questions and strategy phases (max_tool_calls=2 moves the tools mode on; the
    rewrite mode moves on with a valid rewrite): no step raises, and every step has the same invocation keys."""
    made = make(env, files, max_tool_calls=2, refine_strategy=True, questions=1 if env == "LongMemEval" else 3,
                max_turns=300, **({"chat_tokens": 4000} if env in ("BEAM", "BEAM-rewrite") else {}))
    rng = np.random.default_rng(1)
    made.reset(seed=0)
    phases, keys = set(), None
    for i in range(400):
        pool = NASTY_ACTIONS if i % 2 else PROGRESS_ACTIONS
        action = pool[int(rng.integers(len(pool)))]
        phases.add(made.unwrapped._phase)
        obs, reward, terminated, truncated, info = made.step(action)
        assert made.observation_space.contains(obs) and math.isfinite(reward)
        keys = keys or set(info["invocation"])
        assert set(info["invocation"]) == keys
        if terminated or truncated:
            made.reset(seed=i)
    assert phases == {"read", "question", "strategy"}


# Every real-text strategy (agents.scripted.strategies.text_strategies) on every dialog env: a whole episode of valid
# actions, then act() on fuzzed observations (the nasty texts, and the episode's last observation cut anywhere)
# always returns a string. Their served variants and bad constructor arguments: tests/test_dialog_strategies.py.
DIALOG_STRATEGY_ENVS = ("MemDialog", "LoCoMo", "BEAM", "BEAM-data", "BEAM-release", "LongMemEval")


@pytest.mark.parametrize("name", ["full-context", "recency-window", "bm25"])
@pytest.mark.parametrize("env", DIALOG_STRATEGY_ENVS)
def test_text_strategies_play_every_dialog_env_and_never_raise_on_observations(files, env: str, name: str) -> None:
    from agents.scripted.strategies.qa_strategies import make_strategy

    policy = make_strategy(name, ENVS[env][0])
    made = make(env, files, context=policy.context, **policy.env_kwargs,
                **({"chat_tokens": 4000} if env == "BEAM" else {}))
    obs, _ = made.reset(seed=0)
    policy.reset(made.unwrapped)
    terminated = truncated = False
    while not (terminated or truncated):
        obs, _, terminated, truncated, info = made.step(policy.act(obs))
        assert info["invocation"]["valid"], info["invocation"]["error"]
    assert terminated and info["summary"]["answered"]
    rng = np.random.default_rng(0)
    for text in NASTY_ACTIONS + [obs[:int(k)] for k in rng.integers(0, len(obs) + 1, size=20)] + [None, 5]:
        assert isinstance(policy.act(text), str)


# ------------------------------------------------------------------------------------ malformed files
#
# Each case writes one malformed file and names what the error must say besides the file name: the record
# ("record 1") or line ("line 3") and the field.

def _hotpot(mutate) -> str:
    items = copy.deepcopy(TINY_HOTPOT)
    mutate(items)
    return json.dumps(items)


def _set(index: int, key: str, value):
    def mutate(items):
        items[index][key] = value
    return mutate


def _del(index: int, key: str):
    def mutate(items):
        del items[index][key]
    return mutate


def _locomo(mutate) -> str:
    samples = _tiny_locomo()
    samples.append(copy.deepcopy(samples[0]))
    samples[1]["sample_id"] = "tiny-2"
    mutate(samples[1])
    return json.dumps(samples)


def _jsonl(records: list, bad_line: str | None = None, at: int = 2) -> str:
    lines = [json.dumps(r) for r in records]
    if bad_line is not None:
        lines.insert(at, bad_line)
    return "\n".join(lines) + "\n"


# Generic damage, for every loader: R1 and R2 stand for two well-formed records of the loader's own layout,
# so that the error comes from the damage and not from a record.
GENERIC_CONTENTS = [  # (content as text or bytes, fragments)
    (b"[{\"_id\": \"caf\xe9\"}]", ["not UTF-8", "byte offset"]),
    (b"\xff\xfe\x00[", ["not UTF-8"]),
    ("", ["empty file"]),
    ("  \n\n ", ["empty file"]),
    ("[" * 100_000 + "]" * 100_000, ["record 0", "nested too deeply"]),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000 + "\n", ["line 1", "nested too deeply"]),
    ("42", ["line 1", "expected a JSON array"]),
    ('"text"', ["expected a JSON array"]),
    ("null", ["expected a JSON array"]),
    ("[1, 2]", ["record 0", "expected a JSON object", "a int"]),
    ("[[]]", ["record 0", "expected a JSON object, got an array"]),
    ('[R1, "x"]', ["record 1", "got a string"]),
    ('[R1,\n{"a": ', ["record 1", "truncated"]),
    ('[R1', ["record 0", "truncated", "not closed"]),
    ('[R1] trailing', ["line 1", "unexpected data after the JSON array"]),
    ('[R1 R2]', ["record 0", "expected ',' or ']'"]),
    ('{\n  "data": []\n}\n', ["line 1", "invalid JSON"]),
    ('R1\nR2\n{"a": \nR1\n', ["line 3", "invalid JSON"]),
    ('R1\n[1]\n', ["line 2", "expected a JSON object"]),
    ('R1\n{"a": [1, 2', ["line 2", "truncated file"]),
    ('R1\nR2\n{"a" 3}\n', ["line 3", "invalid JSON", "column"]),
]


def _two_locomo_samples() -> list[dict]:
    first = _tiny_locomo()[0]
    second = copy.deepcopy(first)
    second["sample_id"] = "tiny-2"
    return [first, second]


VALID_RECORDS = {
    "hotpot": TINY_HOTPOT[:2],
    "corpus": CORPUS[:2],
    "questions": [{k: v for k, v in q.items() if not k.startswith("supporting")} for q in QUESTIONS],
    "locomo": _two_locomo_samples(),
}


def _fill(content, loader: str):
    if isinstance(content, bytes):
        return content
    r1, r2 = (json.dumps(r) for r in VALID_RECORDS[loader])
    return content.replace("R1", r1).replace("R2", r2)


LOADERS = {
    "hotpot": lambda p: load_hotpotqa(p),
    "corpus": lambda p: load_corpus_jsonl(p),
    "questions": lambda p: load_questions_jsonl(p),
    "locomo": lambda p: load_locomo(p),
}

HOTPOT_FILES = [
    (_hotpot(_del(1, "answer")), ["record 1", "'answer'"]),
    (_hotpot(_set(1, "answer", {"text": "42"})), ["record 1", "answer", "got dict"]),  # a number is its text
    (_hotpot(_set(1, "answer", "  ")), ["record 1", "answer", "empty"]),
    (_hotpot(_set(1, "question", "")), ["record 1", "question", "empty"]),
    (_hotpot(_set(1, "question", ["Who?"])), ["record 1", "question", "expected a string"]),
    (_hotpot(_set(2, "_id", None)), ["record 2", "_id"]),
    (_hotpot(_set(3, "_id", "h1")), ["record 3", "duplicate question id 'h1'"]),
    (_hotpot(_set(1, "supporting_facts", [])), ["record 1", "supporting_facts", "empty"]),
    (_hotpot(_set(1, "supporting_facts", [["Quillon Tower", 5]])), ["record 1", "out of range", "Quillon Tower"]),
    (_hotpot(_set(1, "supporting_facts", [["Quillon Tower", -1]])), ["record 1", "supporting_facts[0][1]"]),
    (_hotpot(_set(1, "supporting_facts", [["Quillon Tower", True]])), ["record 1", "sentence index"]),
    (_hotpot(_set(1, "supporting_facts", [["Quillon Tower"]])), ["record 1", "supporting_facts[0]", "expected"]),
    (_hotpot(_set(1, "supporting_facts", [["Quillon Tower", 0, 1]])), ["record 1", "supporting_facts[0]"]),
    (_hotpot(_set(1, "supporting_facts", [["Nowhere", 0]])), ["record 1", "'Nowhere'", "no context paragraph"]),
    (_hotpot(_set(1, "supporting_facts", "Quillon Tower")), ["record 1", "supporting_facts"]),
    (_hotpot(_set(1, "context", [])), ["record 1", "context", "no paragraph"]),
    (_hotpot(_set(1, "context", [["Quillon Tower"]])), ["record 1", "context[0]"]),
    (_hotpot(_set(1, "context", [["Quillon Tower", "one sentence"]])), ["record 1", "context[0][1]"]),
    (_hotpot(_set(1, "context", [[7, ["s"]]])), ["record 1", "context[0][0]", "title"]),
    (_hotpot(_set(1, "context", [["T", [1, 2]]])), ["record 1", "context[0][1]"]),
    (_hotpot(_set(1, "context", {"title": ["a", "b"], "sentences": [["x"]]})), ["record 1", "2 titles but 1"]),
    (_hotpot(_set(1, "context", "text")), ["record 1", "context"]),
    (_hotpot(_set(1, "type", 3)), ["record 1", "type"]),
    (_hotpot(_set(1, "level", 2)), ["record 1", "level"]),
]

CORPUS_FILES = [
    (_jsonl(CORPUS, '{"id": "d1", "title": "Again", "text": "dup"}', 3), ["line 4", "duplicate document id 'd1'",
                                                                          "line 1"]),
    (_jsonl(CORPUS, '{"id": "d9", "title": "No text"}'), ["line 3", "'text'", "'contents'"]),
    (_jsonl(CORPUS, '{"title": "T", "text": "x"}'), ["line 3", "'id'"]),
    (_jsonl(CORPUS, '{"id": ["d9"], "text": "x"}'), ["line 3", "id", "expected a string"]),
    (_jsonl(CORPUS, '{"id": "d9", "text": 5}'), ["line 3", "text", "expected a string"]),
    (_jsonl(CORPUS, '{"id": "d9", "title": "", "text": "  "}'), ["line 3", "neither title nor text"]),
    (_jsonl(CORPUS, '{"id": "d9", "contents": null}'), ["line 3", "contents"]),
]

QUESTION_FILES = [
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "", "answers": ["a"]}'), ["line 3", "question", "empty"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": 5, "answers": ["a"]}'), ["line 3", "question", "expected a string"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "answers": ["a"]}'), ["line 3", "'question'"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?"}'), ["line 3", "'answers'"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": []}'), ["line 3", "no non-empty gold answer"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": [" "]}'), ["line 3", "no non-empty gold answer"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": [{"a": 1}]}'), ["line 3", "answers[0]", "got dict"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "supporting_ids": []}'),
     ["line 3", "supporting_ids", "empty list"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "supporting_titles": []}'),
     ["line 3", "supporting_titles", "empty list"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "supporting_titles": [["T", 0]]}'),
     ["line 3", "supporting_titles[0]"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "supporting_ids": "d1"}'),
     ["line 3", "supporting_ids", "expected a list"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "hops": 0}'), ["line 3", "hops"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "hops": true}'), ["line 3", "hops"]),
    (_jsonl(QUESTIONS, '{"id": "q1", "question": "Q?", "answers": ["a"]}'), ["line 3", "duplicate question id"]),
    (_jsonl(QUESTIONS, '{"id": "q9", "question": "Q?", "answers": ["a"], "supporting_ids": ["d1"], '
                       '"supporting_titles": ["Tarsk"]}'), ["line 3", "not both"]),
]


def _qa(i: int, key: str, value):
    def mutate(sample):
        if value is _DELETE:
            del sample["qa"][i][key]
        else:
            sample["qa"][i][key] = value
    return mutate


_DELETE = object()


def _conv(key: str, value):
    def mutate(sample):
        if value is _DELETE:
            del sample["conversation"][key]
        else:
            sample["conversation"][key] = value
    return mutate


def _sample(key: str, value):
    def mutate(sample):
        if value is _DELETE:
            del sample[key]
        else:
            sample[key] = value
    return mutate


LOCOMO_FILES = [
    (_locomo(_sample("qa", [])), ["record 1", "qa", "no question"]),
    (_locomo(_sample("qa", _DELETE)), ["record 1", "'qa'"]),
    (_locomo(_sample("qa", {"q": 1})), ["record 1", "qa", "expected a list"]),
    (_locomo(_sample("sample_id", "tiny-1")), ["record 1", "duplicate sample_id 'tiny-1'", "record 0"]),
    (_locomo(_sample("sample_id", [1])), ["record 1", "sample_id"]),
    (_locomo(_sample("conversation", [])), ["record 1", "conversation", "expected an object"]),
    (_locomo(_qa(2, "question", "")), ["record 1", "qa[2].question", "empty"]),
    (_locomo(_qa(2, "question", 3)), ["record 1", "qa[2].question"]),
    (_locomo(_qa(2, "answer", "")), ["record 1", "qa[2].answer", "empty"]),
    (_locomo(_qa(2, "answer", None)), ["record 1", "qa[2].answer"]),
    (_locomo(_qa(2, "answer", _DELETE)), ["record 1", "qa[2]", "'answer'"]),
    (_locomo(_qa(2, "category", 7)), ["record 1", "qa[2].category", "1..5"]),
    (_locomo(_qa(2, "category", True)), ["record 1", "qa[2].category"]),
    (_locomo(_qa(2, "evidence", [])), ["record 1", "qa[2].evidence", "empty", "single-hop"]),
    (_locomo(_qa(2, "evidence", "D1:3")), ["record 1", "qa[2].evidence", "list"]),
    (_locomo(_qa(2, "evidence", [["D1", 3]])), ["record 1", "qa[2].evidence"]),
    (_locomo(_conv("session_2_date_time", _DELETE)), ["record 1", "session_2", "session_2_date_time"]),
    (_locomo(_conv("session_1", "hello")), ["record 1", "conversation.session_1", "list"]),
    (_locomo(_conv("session_1", [{"speaker": "Mara", "dia_id": "D1:1"}])),
     ["record 1", "conversation.session_1[0]", "'text'"]),
    (_locomo(_conv("session_1", [["Mara", "hi"]])), ["record 1", "conversation.session_1[0]", "object"]),
    (_locomo(_conv("speaker_a", 5)), ["record 1", "conversation.speaker_a"]),
    (_locomo(_conv("session_1_date_time", 20230508)), ["record 1", "session_1_date_time"]),
]


def _beam_chat(mutate=None, text: str | None = None) -> str:
    """BEAM_BATCHES with batch 1 changed by ``mutate`` (so errors must name batch 1), or a text template in which
    B1 and B2 stand for the two good batches."""
    if text is not None:
        return text.replace("B1", json.dumps(BEAM_BATCHES[0])).replace("B2", json.dumps(BEAM_BATCHES[1]))
    batches = copy.deepcopy(BEAM_BATCHES)
    mutate(batches[1])
    return json.dumps(batches)


def _message_field(key: str, value):
    """Set (or with _DELETE remove) ``key`` of the batch's message 1 of turn 0."""
    return lambda batch: _sample(key, value)(batch["turns"][0][1])


_DEEP_LIST = "[" * 100_000 + "]" * 100_000
BEAM_CHAT_FILES = [
    (b'[{"batch_number": 1, "turns": [[{"role": "user", "id": 0, "content": "caf\xe9"}]]}]', ["not UTF-8"]),
    ("", ["empty file"]),
    ("  \n ", ["empty file"]),
    (_DEEP_LIST, ["batch 0", "nested too deeply"]),
    (_beam_chat(text="[B1, " + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "]"), ["batch 1", "nested too deeply"]),
    (_beam_chat(_message_field("content", json.loads("[" * 50 + "]" * 50))), ["batch 1", "content"]),
    (_beam_chat(text='[B1, {"batch_number": 2, "turns": [[{"role": "user", "id": 2, "content": ' + _DEEP_LIST
                + "}]]}]"), ["batch 1", "nested too deeply"]),
    ("42", ["expected a JSON array"]),
    ('{"batch_number": 1}', ["expected a JSON array"]),
    ("[1]", ["batch 0", "expected an object"]),
    (_beam_chat(text='[B1, "x"]'), ["batch 1", "expected an object"]),
    (_beam_chat(text='[B1,\n{"batch_number": '), ["batch 1", "truncated"]),
    (_beam_chat(text="[B1"), ["truncated after batch 0"]),
    (_beam_chat(text="[B1] trailing"), ["unexpected data after the JSON array"]),
    (_beam_chat(text="[B1 B2]"), ["after batch 0", "expected ',' or ']'"]),
    (_beam_chat(lambda b: b.pop("turns")), ["batch 1 (batch_number 2)", "missing key 'turns'"]),
    (_beam_chat(lambda b: b.pop("batch_number")), ["batch 1", "missing key 'batch_number'"]),
    (_beam_chat(lambda b: b.update(batch_number=True)), ["batch 1", "batch_number must be"]),
    (_beam_chat(lambda b: b.update(batch_number=[2])), ["batch 1", "batch_number must be"]),
    (_beam_chat(lambda b: b.update(time_anchor=5)), ["batch 1", "time_anchor must be a string"]),
    (_beam_chat(lambda b: b.update(turns="x")), ["batch 1", "turns must be a list"]),
    (_beam_chat(lambda b: b.update(turns=[{"role": "user"}])), ["batch 1", "turn 0", "list of messages"]),
    (_beam_chat(lambda b: b.update(turns=[["hi"]])), ["batch 1", "turn 0, message 0", "expected an object"]),
    (_beam_chat(_message_field("content", _DELETE)), ["batch 1", "message 1", "missing key 'content'"]),
    (_beam_chat(_message_field("role", _DELETE)), ["batch 1", "message 1", "missing key 'role'"]),
    (_beam_chat(_message_field("role", "system")), ["batch 1", "message 1", "role must be"]),
    (_beam_chat(_message_field("content", 5)), ["batch 1", "message 1", "content must be a string"]),
    (_beam_chat(_message_field("content", None)), ["batch 1", "message 1", "content must be a string"]),
    (_beam_chat(_message_field("id", [3])), ["batch 1", "message 1", "id must be an integer or a string"]),
    (_beam_chat(_message_field("id", True)), ["batch 1", "message 1", "id must be", "a boolean"]),
    (_beam_chat(_message_field("index", 1.5)), ["batch 1", "message 1", "index must be"]),
    (_beam_chat(_message_field("time_anchor", 20240305)), ["batch 1", "message 1", "time_anchor must be a string"]),
    (_beam_chat(_message_field("question_type", ["x"])), ["batch 1", "message 1", "question_type must be a string"]),
]


def _beam_questions(mutate=None, ability: str = "information_extraction") -> str:
    questions = copy.deepcopy(BEAM_QUESTIONS)
    if mutate is not None:
        mutate(questions[ability][0])
    return json.dumps(questions)


BEAM_QUESTION_FILES = [
    (b'{"abstention": [{"question": "caf\xe9?"}]}', ["not UTF-8"]),
    ("", ["empty file"]),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, ["nested too deeply"]),
    ('{"abstention": [', ["invalid JSON", "line 1"]),
    ("[]", ["expected an object from ability"]),
    ('{"telepathy": []}', ["unknown ability 'telepathy'", *ABILITIES]),
    ('{"summarization": {}}', ["summarization", "expected a list of questions"]),
    ('{"summarization": ["Sum?"]}', ["summarization[0]", "expected an object"]),
    (_beam_questions(_sample("question", _DELETE)), ["information_extraction[0]", "missing key 'question'"]),
    (_beam_questions(_sample("question", "  ")), ["information_extraction[0]", "empty question"]),
    (_beam_questions(_sample("question", 5)), ["information_extraction[0]", "question must be a string"]),
    (_beam_questions(_sample("answer", _DELETE)), ["information_extraction[0]", "no reference", "answer"]),
    (_beam_questions(_sample("answer", "")), ["information_extraction[0]", "answer: empty answer"]),
    (_beam_questions(_sample("answer", None)), ["information_extraction[0]", "answer: empty answer"]),
    (_beam_questions(_sample("answer", [1, {}])), ["information_extraction[0]", "answer", "got dict"]),
    (_beam_questions(_sample("answer", math.nan)), ["information_extraction[0]", "answer"]),
    (_beam_questions(_sample("rubric", 5)), ["information_extraction[0]", "rubric must be a list of strings"]),
    (_beam_questions(_sample("rubric", ["ok", 1])), ["information_extraction[0]", "rubric"]),
    (_beam_questions(_sample("compliance_indicators", "euros")),
     ["information_extraction[0]", "compliance_indicators"]),
    (_beam_questions(_sample("source_chat_ids", [1.5])),
     ["information_extraction[0]", "source_chat_ids", "message ids", "a float"]),
    (_beam_questions(_sample("source_chat_ids", {"first": [0, True]})),
     ["information_extraction[0]", "source_chat_ids", "a boolean"]),
    (_beam_questions(_sample("evidence", [[[[[0]]]]])), ["information_extraction[0]", "evidence", "too deeply"]),
    (_beam_questions(_sample("order", "woke up"), "event_ordering"), ["event_ordering[0]", "order", "list"]),
    (_beam_questions(_sample("difficulty", ["easy"])), ["information_extraction[0]", "difficulty"]),
]

BEAM_LOADERS = {
    "beam-chat": lambda p: list(iter_chat_batches(p, read_size=1024)),  # small reads: batches span reads
    "beam-questions": lambda p: load_probing_questions(p),
}


def _file_cases() -> list:
    cases = []
    for loader in LOADERS:
        for i, (content, fragments) in enumerate(GENERIC_CONTENTS):
            cases.append(pytest.param(loader, _fill(content, loader), fragments, id=f"{loader}-generic{i}"))
    for loader, table in (("hotpot", HOTPOT_FILES), ("corpus", CORPUS_FILES), ("questions", QUESTION_FILES),
                          ("locomo", LOCOMO_FILES), ("beam-chat", BEAM_CHAT_FILES),
                          ("beam-questions", BEAM_QUESTION_FILES)):
        for i, (content, fragments) in enumerate(table):
            cases.append(pytest.param(loader, content, fragments, id=f"{loader}-{i}"))
    return cases


@pytest.mark.parametrize("loader, content, fragments", _file_cases())
def test_malformed_file_names_file_and_record(tmp_path: Path, loader: str, content, fragments: list) -> None:
    path = tmp_path / f"bad_{loader}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        {**LOADERS, **BEAM_LOADERS}[loader](path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_locomo_dangling_evidence_warns_once_naming_file_and_records(tmp_path: Path) -> None:
    samples = _tiny_locomo()
    samples[0]["qa"][1]["evidence"] = ["D9:9"]
    samples[0]["qa"][3]["evidence"] = ["D1:1; D2:1", "D:1:02"]  # joined and misspelt ids are repaired
    path = tmp_path / "dangling.json"
    path.write_text(json.dumps(samples), encoding="utf-8")
    with pytest.warns(DataFormatWarning) as caught:
        conversations = load_locomo(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert str(path) in message and "1 evidence" in message and "record 0 (tiny-1) qa[1]: 'D9:9'" in message
    questions = conversations[0].questions
    assert questions[1].supporting_ids == ("D9:9",)  # kept as given
    assert questions[3].supporting_ids == ("D1:1", "D2:1", "D1:2")


def test_locomo_empty_evidence_is_allowed_for_open_domain_and_adversarial(tmp_path: Path) -> None:
    samples = _tiny_locomo()
    categories = [q["category"] for q in samples[0]["qa"]]
    for q in samples[0]["qa"]:
        if q["category"] in (3, 5):
            q["evidence"] = []
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(samples), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        questions = load_locomo(path)[0].questions
    assert [q.meta["category"] for q in questions] == categories
    assert all(q.supporting_ids == () for q in questions if q.meta["category"] in (3, 5))


@pytest.mark.parametrize("kind, kwargs_key", [("hotpot", "data_path"), ("corpus", "corpus_path"),
                                              ("questions", "questions_path"), ("locomo", "data_path")])
def test_env_make_reports_the_malformed_file(files, tmp_path: Path, kind: str, kwargs_key: str) -> None:
    bad = tmp_path / f"broken_{kind}.json"
    bad.write_text(_fill('[R1, {"b": ', kind), encoding="utf-8")
    env = {"hotpot": "Hotpot", "corpus": "Pair", "questions": "Pair", "locomo": "LoCoMo"}[kind]
    with pytest.raises(DataFormatError) as info:
        make(env, files, **{kwargs_key: str(bad)})
    assert str(bad) in str(info.value) and "record 1" in str(info.value)


# `memenv index build`: what would lose the user's files, and bad BM25 parameters (tests/test_index_safety.py
# has the rest). Each: one line, exit 2, nothing changed.
INDEX_BUILD_CASES = [
    (["{corpus}", "{folder}"], "holds the corpus"),
    (["{corpus}", "{corpus}"], "is the corpus file itself"),
    (["{corpus}", "{folder}/other"], "is not a memenv index"),
    (["{corpus}", "{folder}/new", "--k1", "nan"], "k1 must be a finite number > 0, got nan"),
    (["{corpus}", "{folder}/new", "--k1", "-1"], "k1 must be a finite number > 0"),
    (["{corpus}", "{folder}/new", "--b", "5"], "b must be a finite number in [0, 1]"),
]


@pytest.mark.parametrize("args, fragment", INDEX_BUILD_CASES)
def test_index_build_refuses_in_one_line_and_changes_nothing(files, capsys, args: list, fragment: str) -> None:
    from memenv.cli import main

    folder = Path(files["corpus"]).parent
    (folder / "other").mkdir()
    (folder / "other" / "keep.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    argv = ["index", "build", *(a.format(corpus=files["corpus"], folder=folder) for a in args), "--workers", "0"]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], errors
    assert {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} == before


def test_damaged_index_fails_at_make_naming_the_file(files, tmp_path: Path) -> None:
    from memenv.search.index.build import build_index
    from memenv.search.index.format import IndexCorruptError

    build_index(files["corpus"], tmp_path / "idx", progress=False, workers=0)
    terms = tmp_path / "idx" / "terms.txt"
    terms.write_bytes(terms.read_bytes()[: terms.stat().st_size // 2])
    with pytest.raises(IndexCorruptError) as info:
        gym.make("MemQA-v0", index_path=str(tmp_path / "idx"), questions_path=files["questions"])
    assert str(terms) in str(info.value) and "when the index was built" in str(info.value)


def test_beam_env_reports_malformed_questions_at_make_and_chat_at_reset(files) -> None:
    conversation = Path(files["beam"]) / "2"
    questions = conversation / "probing_questions" / "probing_questions.json"
    good = questions.read_text(encoding="utf-8")
    questions.write_text(_beam_questions(_sample("question", "")), encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        make("BEAM-data", files)  # both conversations' questions are read at make
    assert str(questions) in str(info.value) and "information_extraction[0]: empty question" in str(info.value)
    questions.write_text(good, encoding="utf-8")
    (conversation / "chat.json").write_text(_beam_chat(_message_field("role", "system")), encoding="utf-8")
    env = make("BEAM-data", files, conversation=1)  # chat.json (up to 10M tokens) is streamed at reset
    with pytest.raises(DataFormatError) as info:
        env.reset(seed=0)
    assert str(conversation / "chat.json") in str(info.value) and "batch 1 (batch_number 2)" in str(info.value)


def test_beam_evidence_forms_are_kept_as_message_ids(tmp_path: Path) -> None:
    questions = copy.deepcopy(BEAM_QUESTIONS)
    questions["information_extraction"][0]["source_chat_ids"] = {"first_statement": [0, "1"], "second": 2}
    questions["event_ordering"][0]["evidence"] = 3
    path = tmp_path / "probing_questions.json"
    path.write_text(json.dumps(questions), encoding="utf-8")
    loaded = {q.kind: q for q in load_probing_questions(path)}
    assert loaded["information_extraction"].meta["evidence"] == ["0", "1", "2"]
    assert loaded["event_ordering"].meta["evidence"] == ["3"]
    assert loaded["abstention"].meta["evidence"] == []


def test_pair_of_good_files_still_loads(files) -> None:
    # The stricter checks do not reject the well-formed fixtures.
    dataset = load_qa_pair(files["corpus"], files["questions"])
    assert [q.supporting_ids for q in dataset.questions] == [("d1", "d2"), ("d1",)]
    assert len(load_hotpotqa(files["hotpot"])) == 4


@pytest.mark.parametrize("env_id, typo, meant", [("MemQA-v0", "objectivs", "objectives"),
                                                 ("MemRead-v0", "doc_token", "doc_tokens"),
                                                 ("MemDialog-v0", "sesions", "sessions"),
                                                 ("MemDialog-BEAM-v0", "bogus", None)])
def test_a_misspelled_kwarg_is_one_line_listing_the_valid_ones(env_id: str, typo: str, meant) -> None:
    """Not Python's bare "unexpected keyword argument": the unknown name, the closest valid one, every valid one."""
    import inspect

    with pytest.raises(TypeError) as caught:
        gym.make(env_id, **{typo: 1})
    text = str(caught.value)
    assert "\n" not in text and f"unknown keyword argument(s) '{typo}'" in text
    assert (f"did you mean '{meant}'?" in text) if meant else "did you mean" not in text
    env_class = gym.spec(env_id).entry_point.split(":")[1]
    import importlib

    module, name = gym.spec(env_id).entry_point.split(":")
    valid = [p for p in inspect.signature(getattr(importlib.import_module(module), name)).parameters if p != "self"]
    assert env_class in text and "valid kwargs: " + ", ".join(valid) in text
