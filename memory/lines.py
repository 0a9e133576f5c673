"""A fragment's lines as the store indexes them for the per-call search (docs/ARCHITECTURE.md,
"Read path"; README.md, "How memory is chosen for a call").

One tokenisation in every engine. Milvus's BM25 function analyses a text field itself, and its
analyzers differ between engines (Milvus Lite's `standard` keeps a run of Chinese characters as
one word, the server's splits it into characters; neither stems English). So the worker writes
the project's own analysed terms (`memory.text.token_list`: stemmed words, CJK character
unigrams and bigrams) into that field, each as a short hex digest (`term_token`), which every
`standard` tokenizer keeps whole: Milvus only counts them. The query goes through the same two
steps (`query_terms`), so a question and a line meet on exactly the terms the in-process search
compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from mnemoflow.memory.search import DROP_QUESTION_WORDS, split_lines
from mnemoflow.memory.text import QUESTION_TOKENS, normalise, token_list

__all__ = ["LINES_SUFFIX", "indexed_terms", "line_id", "line_texts", "query_terms", "term_token"]

#: Hex digits of a term's digest: 12 (48 bits) keep collisions below 1e-6 among 10^4 distinct
#: terms of one user's lines, and a line's field short.
TERM_DIGITS = 12
#: Separates a fragment id from a line's position in a line row's primary key.
LINE_SEPARATOR = "#"
#: The line collection of a fragment collection is named after it (`activities/line_rows.py`
#: writes it, `middleware/milvus_search.py` reads it). "_lines3": rows carry their fragment's
#: fields and no vector (the dense side reads the fragment collection); "_lines2" carried the
#: fragment's vector on every line, "_lines" no fragment fields.
LINES_SUFFIX = "_lines3"


def term_token(term: str) -> str:
    """One analysed term as the BM25 field holds it: `t` and hex digits, one word to any
    tokenizer, lower case already."""
    return "t" + hashlib.blake2b(term.encode("utf-8"), digest_size=TERM_DIGITS // 2).hexdigest()


def _joined(terms: Iterable[str]) -> str:
    return " ".join(term_token(t) for t in terms)


def indexed_terms(text: str) -> str:
    """What a line's BM25 field holds: its analysed terms, repeats kept (term frequency)."""
    return _joined(token_list(normalise(text)))


def query_terms(query: str) -> str:
    """The question's terms as the BM25 search takes them: as `memory.search.SearchIndex`'s
    lexical query (words that only make a question a question left out, unless that is all)."""
    terms = token_list(normalise(query))
    if DROP_QUESTION_WORDS:
        terms = [t for t in terms if t not in QUESTION_TOKENS] or terms
    return _joined(terms)


def line_texts(content: str) -> list[str]:
    """A fragment's lines in order (`memory.search.split_lines`: one per speaker turn)."""
    return split_lines(content)


def line_id(fragment_id: str, position: int) -> str:
    """A line row's primary key: its fragment's id and its position there."""
    return f"{fragment_id}{LINE_SEPARATOR}{position}"
