"""Task sources for memenv: the synthetic knowledge world and loaders for real data.

This layer imports nothing else of the project.
"""

from tasks.types import (DataFormatError, DataFormatWarning, Document, QADataset, Question, answer_text,
                         gold_answer_text)

__all__ = ["DataFormatError", "DataFormatWarning", "Document", "QADataset", "Question", "answer_text",
           "gold_answer_text"]
