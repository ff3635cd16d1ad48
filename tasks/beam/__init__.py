"""BEAM (Beyond a Million Tokens) conversations: a streaming loader for its layout and a seeded synthetic generator.

BEAM's layout, one directory per conversation::

    <conv>/chat.json                                   [{"batch_number", "time_anchor", "turns": [[message, ...], ...]}, ...]
    <conv>/probing_questions/probing_questions.json    {ability: [{"question", <reference>, "rubric", "difficulty", ...}]}

A message is ``{"role": "user"|"assistant", "id", "index", "content", "time_anchor"?, "question_type"?}``. In the
official release a batch's ``time_anchor`` is ``null`` (the batch then takes the first anchor of its messages, or
``""``), ids are ints, user messages carry ``index: "B,T"`` and end with a ``->-> B,T`` marker (cut at load), and
each chat folder holds other files (``chat.pickle``, ``plan*.txt``, ``chat_trunecated.json``, ...) that are never
read; evidence is ``source_chat_ids`` (a list, ints mixed with lists, or a dict of named lists). The
reference sits under an ability-dependent key (:data:`REFERENCE_KEYS`: ``answer``, ``ideal_response``,
``ideal_answer``, ``ideal_summary`` or ``expected_compliance`` with ``compliance_indicators``).

Memory: a 10M-token chat is never materialised. :func:`iter_chat_batches` parses ``chat.json`` one batch at a
time (``json.JSONDecoder.raw_decode`` over a growing read buffer, so at most one batch is held; a batch past
1 Mi characters is read piece by piece, and a message longer than :data:`MAX_MESSAGE_CHARS` keeps its start and
a marker with the count cut, the rest never decoded or held, so one 50 MB message costs ~1 MB), and
:class:`SyntheticBeamChat` keeps only a plan of its facts (O(number of questions)) and renders each batch on
demand from a per-batch seed. Both yield :class:`BeamBatch` objects; a batch is one session of the env.

Malformed input raises :class:`~tasks.types.DataFormatError` naming the file, the batch (0-based position and
``batch_number``) and, inside it, the turn and message index, or the ability and question index.

The synthetic generator (:class:`SyntheticBeamChat`) writes a user talking to an assistant over dated batches:
long filler exchanges (how-to questions, often after a first-person statement that looks like a fact but is
never asked about, and long answers, so the chat reaches 128K to 10M whitespace tokens)
with, at planned places, personal facts that are stated, updated, contradicted, ordered in time, preferences
and instructions the assistant must follow later, and none of what the abstention questions ask about. Each
of the ten abilities (:data:`ABILITIES`) gets ``questions_per_ability`` questions with a reference, a rubric and
the ids of its evidence messages (``meta["evidence"]``; event ordering also ``meta["order"]``).

One concern per module, every public name re-exported here: ``chat`` (the batches and the streaming reader of
``chat.json``), ``questions`` (the abilities, :func:`load_probing_questions`), ``sources`` (the conversations an env
plays: :class:`BeamConversation`, :class:`ConversationSource`, :class:`BatchStream`, :func:`find_conversations`),
``synthetic`` (:class:`SyntheticBeamChat`, :func:`write_beam_directory`).
"""

from tasks.beam.chat import CHAT_FILE, MAX_MESSAGE_CHARS, BeamBatch, BeamMessage, cut_marker, iter_chat_batches
from tasks.beam.questions import ABILITIES, QUESTIONS_FILE, REFERENCE_KEYS, load_probing_questions
from tasks.beam.sources import BatchStream, BeamConversation, ConversationSource, conversation_files, find_conversations
from tasks.beam.synthetic import SyntheticBeamChat, write_beam_directory
__all__ = [
    "ABILITIES",
    "REFERENCE_KEYS",
    "BeamBatch",
    "BeamConversation",
    "BeamMessage",
    "BatchStream",
    "CHAT_FILE",
    "ConversationSource",
    "MAX_MESSAGE_CHARS",
    "QUESTIONS_FILE",
    "SyntheticBeamChat",
    "conversation_files",
    "cut_marker",
    "find_conversations",
    "iter_chat_batches",
    "load_probing_questions",
    "write_beam_directory",
]
