"""The search index without the text no reader searches for, so the first search is sooner.

Material's search worker builds its lunr index in the reader's browser before the first
results, and that build was most of the time to them (headless Chromium on a shared, loaded
2-core machine: the time to the worker's READY, index fetched and built, was 2.2-2.4 s of
the 2.3-2.6 s to the first result, at load 3.4-4.2; issue 32 item 9). Its cost follows the
number of words indexed (1.97 MB of index, 248,000 tokens). Two kinds of block held 46%
of them and are not what a reader's search is for:

- code blocks and program output (``<pre>``): the starters' code, its argument parsing,
  local variables and printed tables (21% of the words);
- the verified-claims lists (``directives.verified_claims``, most under "What the tests
  check" and in the lab guides' "The code, explained"): the page's claims once more, one
  line per test (25%).

:func:`slim_index` takes both out of the sections' ``text`` (what a result shows) and keeps,
in a field of the same section, ``keywords`` (searched like the text, never shown), each of
their words that has a letter a-z, is not a stop word (Material's pipeline drops those) and
begins no word of the rest of the page's titles and text (an API name only a claim or a
code block mentions, ``cpu_offload_with_hook``). Material searches an unquoted term as a
prefix, so such a query that found a page before still finds it (unless the only
word it begins there is a stop word, which is not indexed). Not kept, so no longer
found on that page: a number or other token without a letter a-z (``0.18215`` only a code
block had), a quoted (exact) term that only a longer word of the page begins with, and a
query that keeps a block's punctuation at its ends. A word the page's prose also has now
lists the prose first, and a result's teaser is prose rather than a code block. The index
is then 1.17 MB (0.35 MB gzip, from 0.54) and 145,000 tokens.

:func:`infralens_docs.search_terms.tag_sections` applies :func:`slim_index` when it rewrites
``site/search/search_index.json`` after Material's search plugin has written it
(``hooks.on_post_build``), through :func:`slim_cached`: a build whose index is the last
one's (a warm build) reads the result from ``.cache/search/slim.json``.
"""

from __future__ import annotations

import bisect
import hashlib
import html
import json
import re
from collections import defaultdict
from pathlib import Path

from infralens_docs.runner import CACHE_ROOT

CACHE = CACHE_ROOT / "search" / "slim.json"
#: the index field that holds the taken-out blocks' words (searched, not shown)
FIELD = "keywords"
#: lunr.stopWordFilter's list (lunr 2.3.9), which Material's English pipeline runs: such a
#: word is never indexed, so a block's stop words need no keeping
STOP_WORDS = frozenset(
    "a able about across after all almost also am among an and any are as at be because been"
    " but by can cannot could dear did do does either else ever every for from get got had has"
    " have he her hers him his how however i if in into is it its just least let like likely"
    " may me might most must my neither no nor not of off often on only or other our own"
    " rather said say says she should since so some than that the their them then there these"
    " they this tis to too twas us wants was we were what when where which while who whom why"
    " will with would yet you your".split()
)
PRE_RE = re.compile(r"<pre>.*?</pre>", re.DOTALL)
#: the verified-claims list as Material indexes it: its lead paragraph
#: (directives.verified_claims), then one list item per test
CLAIMS_LEAD = "Each line is one test in "
CLAIMS_RE = re.compile(rf"(<p>{CLAIMS_LEAD}.*?</p>)\s*<ul>.*?</ul>", re.DOTALL)
EDGE_RE = re.compile(r"^\W+|\W+$")
LETTER_RE = re.compile(r"[a-z]")
SPACE_RE = re.compile(r"\s+")


def _tokens(markup: str, splitter: re.Pattern) -> list[str]:
    """The tokens Material's search tokenizer makes of a field: the text between tags,
    split at the index's separator (``splitter`` matches either), lower-cased."""
    return [t.lower() for t in splitter.split(markup) if t]


def _word_char(char: str) -> bool:
    """``\\w``, without a regular expression (most tokens need no stripping)."""
    return char.isalnum() or char == "_"


def _covered(token: str, kept: list[str]) -> bool:
    """Whether a query that finds ``token`` finds one of the (sorted) ``kept`` tokens too:
    Material searches every unquoted query term as a prefix (a quoted one exactly)."""
    i = bisect.bisect_left(kept, token)
    return i < len(kept) and kept[i].startswith(token)


def slim_index(data: dict) -> dict:
    """``data`` (the parsed search_index.json) without code blocks and verified-claims lists
    in its sections' text; their words that the page has nowhere else in ``keywords``."""
    if "config" not in data:
        return data  # not Material's index
    separator = re.compile(rf"<[^>]*>|(?:{data['config']['separator']})")
    pages: dict[str, list[dict]] = defaultdict(list)
    for entry in data["docs"]:
        pages[entry["location"].partition("#")[0]].append(entry)
    for entries in pages.values():
        taken = []
        for entry in entries:
            text = entry.get("text", "")
            out = PRE_RE.findall(text) + [m.group(0) for m in CLAIMS_RE.finditer(text)]
            text = CLAIMS_RE.sub(r"\1", PRE_RE.sub(" ", text))
            entry["text"] = SPACE_RE.sub(" ", text).strip()
            taken.append(" ".join(out))
        shown = (
            _tokens(e.get(field, ""), separator) for e in entries for field in ("title", "text")
        )
        kept = sorted({token for tokens in shown for token in tokens})
        for entry, out in zip(entries, taken, strict=True):
            words: dict[str, None] = {}
            for token in dict.fromkeys(_tokens(out, separator)):  # each once, in order
                word = html.unescape(token) if "&" in token else token
                if not (_word_char(word[0]) and _word_char(word[-1])):
                    word = EDGE_RE.sub("", word)
                if LETTER_RE.search(word) and word not in STOP_WORDS and not _covered(word, kept):
                    words[word] = None
            if words:
                entry[FIELD] = html.escape(" ".join(words), quote=False)
    data["config"]["fields"][FIELD] = {"boost": 1.0}  # as the text's
    return data


def slim_cached(text: str) -> dict:
    """:func:`slim_index` of an index's JSON ``text``; the last result again when the text
    (and this module) are the same."""
    key = hashlib.sha256(Path(__file__).read_bytes() + b"\0" + text.encode("utf-8")).hexdigest()
    try:
        cached = json.loads(CACHE.read_text(encoding="utf-8"))
        if cached["key"] == key:
            return cached["data"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: slim it
    data = slim_index(json.loads(text))
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "data": data}, separators=(",", ":")), encoding="utf-8")
    tmp.replace(CACHE)
    return data
