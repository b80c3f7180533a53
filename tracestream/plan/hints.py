"""What to suggest when a pattern matches no kernel: the closest kernel names on the trace.

A refusal that only says "no kernel matches" sends the user to `inspect` to find the name
they mistyped; naming the few closest names in the same line usually saves that trip.
The names come from the index (`index.vocabulary`), so suggesting costs no second pass.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from difflib import SequenceMatcher

from tracestream.errors import Option, SpecError
from tracestream.index.vocabulary import KernelVocabulary

HINTS = 5
CLOSE = 0.8
"""The similarity (`_similarity`) a name needs to be named beside closer ones (at 0.6 or 0.75, a
four-letter pattern found enough of itself in any long template name)."""
COMPARED = 200
"""Characters of a name and of the pattern that edit distance compares: difflib's cost grows
with both lengths (a thousand-character pattern against templated names took minutes), and
a mistyped name shows in its first characters."""
FAR_HINTS = 3
"""Names given when none is close: the nearest few, so the line still shows what is there."""
SHORTLIST = 200
"""Names compared by edit distance at most: difflib takes ~80 µs a long kernel name, so a
trace with tens of thousands of names is first cut down by shared trigrams (cheap substring
tests)."""

_BREAK = set(".^$|()[]{}*+?")


def literal_parts(pattern: str) -> list[list[str]]:
    """The literal text of a regular expression, lower-cased: per alternative (`a|b`), the
    runs of plain characters it requires. Anchors, classes, groups and wildcards split the
    runs; a character made optional (`?`, `*`, `{0,`) is dropped; an escaped
    metacharacter (`\\.`) is literal. Good enough to compare with names, not a parser."""
    alternatives: list[list[str]] = [[]]
    run: list[str] = []

    def cut() -> None:
        if run:
            alternatives[-1].append("".join(run).lower())
            run.clear()

    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.isalnum():  # \d, \w, \b, \A ...: not literal
                cut()
            else:
                run.append(nxt)
            i += 2
            continue
        if c == "[":  # a class: skip to its end (a `]` first in it is literal)
            start = i + 1 + (pattern[i + 1:i + 2] == "^")
            end = pattern.find("]", start + (pattern[start:start + 1] == "]"))
            cut()
            i = len(pattern) if end < 0 else end + 1
            continue
        if c in "?*" or (c == "{" and pattern[i + 1:i + 2] == "0"):
            if run:
                run.pop()  # the character before is optional
        if c == "{" or pattern.startswith("(?", i):  # a count; (?:, (?P<name>, (?i), (?=...
            close = ("}" if c == "{" else ">" if pattern.startswith("(?P<", i)
                     else ":" if pattern.startswith("(?:", i) else ")")
            end = pattern.find(close, i)
            cut()
            i = len(pattern) if end < 0 else end + 1
            continue
        if c == "|":
            cut()
            alternatives.append([])
        elif c in _BREAK:
            cut()
        else:
            run.append(c)
        i += 1
    cut()
    return [parts for parts in alternatives if parts] or [[]]


def _trigrams(texts: Iterable[str]) -> set[str]:
    return {t[i:i + 3] for t in texts for i in range(max(len(t) - 2, 1))}


def _similarity(wanted: str, name: str) -> float:
    """How close `wanted` comes to `name` or to a stretch of it as long as itself (difflib's
    ratio, 0..1): a kernel name is often far longer than what a user types of it."""
    if not wanted:
        return 0.0
    if len(name) <= len(wanted):
        return SequenceMatcher(None, wanted, name).ratio()
    best = 0.0
    window = SequenceMatcher(None, wanted)
    for block in SequenceMatcher(None, wanted, name, autojunk=False).get_matching_blocks():
        start = max(block.b - block.a, 0)
        window.set_seq2(name[start:start + len(wanted)])
        best = max(best, window.ratio())
    return best


def closest_names(pattern: str, names: Mapping[str, int] | Iterable[str],
                  limit: int = HINTS) -> list[str]:
    """Up to `limit` of `names` closest to a regular expression that matched none of them.

    First the names that contain the pattern's literal text (every run of some alternative
    of it, case-insensitively; see `literal_parts`), shortest first: the rest of such a
    name is what the pattern did not expect. Then the others by edit-distance similarity to
    that text (`_similarity`), then to the whole name (so `^k_rop_store$` prefers
    `_k_rope_store` to `_q_rope_store`). Ties go to the name that occurs most often
    (`names` may map each name to its count), then in name order."""
    counts = names if isinstance(names, Mapping) else dict.fromkeys(names, 0)
    lowered = {name: name.lower() for name in counts}
    alternatives = literal_parts(pattern)

    def contains(low: str) -> bool:
        return any(parts and all(p in low for p in parts) for parts in alternatives)

    containing = [name for name, low in lowered.items() if contains(low)]
    picked = heapq.nsmallest(limit, containing, key=lambda n: (len(n), -counts[n], n))
    if len(picked) == limit:
        return picked
    taken = set(containing)
    others = [name for name in counts if name not in taken]
    wanted = ["".join(parts) for parts in alternatives]
    if len(others) > SHORTLIST:
        grams = _trigrams(w for w in wanted if w)
        others = heapq.nlargest(SHORTLIST, others, key=lambda n: (
            sum(g in lowered[n] for g in grams), -len(n)))
    wanted = [w[:COMPARED] for w in wanted]
    score = {name: max((_similarity(w, lowered[name][:COMPARED]),
                        SequenceMatcher(None, w, lowered[name][:COMPARED]).ratio())
                       for w in wanted)
             for name in others}
    ranked = heapq.nsmallest(limit - len(picked), others,
                             key=lambda n: (-score[n][0], -score[n][1], -counts[n], n))
    close = [name for name in ranked if score[name][0] >= CLOSE]
    # names far from the pattern only pad the line, unless nothing is close at all
    return picked + close if picked or close else ranked[:FAR_HINTS]


def no_match(what: str, pattern: str, vocabulary: KernelVocabulary, pids=None, where: str = "",
             nowhere: str = "the trace has no kernels", scope: str = "") -> SpecError:
    """The refusal of a pattern (spec field `what`) that matches no kernel `where` (e.g.
    " in pid 0"): it ends with the closest kernel names on the given pids (all by default;
    `scope` says which where `where` does not), or with `nowhere` when they have none."""
    head = ("no kernel matches ", Option(what), f" {pattern!r}{where}; ")
    pids = vocabulary.pids() if pids is None else pids
    if not pids:
        return SpecError(*head, nowhere)
    counts = vocabulary.names(pids)
    if not counts:  # only where the cap left every name of these pids out
        return SpecError(*head, f"no kernel names kept{scope} (at most {vocabulary.limit:,} "
                                "are kept)")
    as_text: dict[str, int] = {}
    for name, n in counts.items():  # a number as a name is matched as its text
        text = name if isinstance(name, str) else str(name)
        as_text[text] = as_text.get(text, 0) + n
    found = ", ".join(repr(name) for name in closest_names(pattern, as_text))
    among = f" (among the first {vocabulary.limit:,} kept)" if vocabulary.full else ""
    return SpecError(*head, f"closest kernel names{scope}{among}: {found}")
