"""Text search: what goes into the full-text index, and a caller's words turned into an FTS5 query.

The index (schema 3) is FTS5 with the porter stemmer over unicode61 (diacritics folded), so
`invoice` finds `invoices` and `café` finds `cafe`; a word of any language is still one token
and matches itself exactly (stemming changes a word the same way in the entry and in the
query). Scripts written without spaces (Chinese, Japanese, Korean, Thai, ...) would be one
token per run of text, so every such character is indexed as a token of its own, and a word
of them in a query is searched as a phrase: `数据库` finds `数据库是系统`.

A caller's text is never FTS5 syntax: it is cut at white space and every piece is quoted as a
phrase (quotes doubled), each piece must match, and each matches exactly or as a prefix, the
exact match ranking higher.
"""

from __future__ import annotations

import re
import unicodedata

from .model import MAX_QUERY, MAX_QUERY_BYTES, MAX_QUERY_WORDS, Refused, check_text

# Characters of scripts written without spaces between words: each one its own token.
_UNSPACED = (
    "\u0e00-\u0e7f"  # Thai
    "\u0e80-\u0eff"  # Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u31f0-\u31ff"  # Katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables (particles are written joined to the word)
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0003134f"  # CJK extensions B-G
)
_UNSPACED_CHAR = re.compile(f"([{_UNSPACED}])")
# The columns' weights for bm25: a word in the key says more than one in the content.
WEIGHTS = (1.0, 3.0)


def indexed(text: str) -> str:
    """The text as the index gets it: unspaced scripts one character a token."""
    return _UNSPACED_CHAR.sub(r" \1 ", text)


def _meaningful(piece: str) -> bool:
    return any(ch.isalnum() or unicodedata.category(ch).startswith("M") for ch in piece)


def fts_query(query: object) -> str:
    """The FTS5 MATCH expression for a caller's words; Refused when there is nothing to search for."""
    text = check_text(query, "query", MAX_QUERY, MAX_QUERY_BYTES, required=False, lines=True)
    pieces = [p for p in text.split() if _meaningful(p)]
    if not pieces:
        raise Refused(
            f"query {query!r:.80} has no words to search for: give one or more words "
            f"(at most {MAX_QUERY} characters), e.g. 'postgres migration'; every word must match"
        )
    if len(pieces) > MAX_QUERY_WORDS:
        raise Refused(
            f"query has {len(pieces)} words, more than {MAX_QUERY_WORDS}: every word must match, so fewer, "
            "more telling words find more"
        )
    terms = []
    for piece in pieces:
        phrase = '"' + indexed(piece).replace('"', '""') + '"'
        words = re.findall(r"\w+", piece)
        last = words[-1] if words else ""
        # A prefix of an unspaced script's single character, or of one letter, would match nearly everything.
        if len(last) >= 2 and not _UNSPACED_CHAR.search(last[-1]):
            terms.append(f"({phrase} OR {phrase} *)")  # an exact match scores in both: it ranks first
        else:
            terms.append(phrase)
    return " AND ".join(terms)
