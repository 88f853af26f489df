"""The reply as Markdown, with its token chips kept: the reading view of the token view ("the reply").

A model's reply often is Markdown (`**bold**`, numbered lists). This module reads a small, safe part of it (paragraphs,
line breaks, headings, lists, block quotes, code blocks, rules; bold, italic and code spans, backslash escapes) and
draws it with every character still in the span of the token that wrote it, so that the colours and tooltips stay.
The markup characters themselves are not drawn. Nothing else is markup: raw HTML and links stay text, and every
character goes through the caller's escaping (`chip`). No gradio import.

Input: pieces of (text, key) in order, where `key` names what wrote the text (a token, or the prompt); a piece with
no text (a piece of a character) is kept as a zero-width entry. Output: HTML built only from the tags below, each
run of one key's characters drawn by `chip(key, text, classes)`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

Entry = tuple[str, Hashable]  # one character (or "" for a zero-width piece) and the key of what wrote it
Chip = Callable[[Hashable, str, tuple[str, ...]], str]  # (key, text, style classes) -> escaped HTML

FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+|$)")
RULE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
BULLET = re.compile(r"( *)([-*+])[ \t]+")
ORDERED = re.compile(r"( *)(\d{1,9})[.)][ \t]+")
QUOTE = re.compile(r" {0,3}>[ \t]?")
STYLE = {"b": "sd-md-b", "i": "sd-md-i", "code": "sd-md-code"}  # inline styles, as classes on the chips


@dataclass
class Block:
    kind: str  # "p", "h", "ul", "ol", "quote", "code", "rule"
    lines: list[list[Entry]] = field(default_factory=list)
    breaks: list[Entry] = field(default_factory=list)  # the newline entry that ended each line but the last
    level: int = 0  # a heading's level; a list item's indent
    number: int = 0  # an ordered item's number
    pending: Entry | None = None  # the newline that ended the last line, drawn if another line follows


def lines_of(entries: list[Entry]) -> list[tuple[list[Entry], Entry | None]]:
    """The entries split at newlines: (a line's entries, the newline entry that ended it or None)."""
    out, line = [], []
    for entry in entries:
        if entry[0] == "\n":
            out.append((line, entry))
            line = []
        else:
            line.append(entry)
    out.append((line, None))
    return out


def text_of(line: list[Entry]) -> str:
    return "".join(ch for ch, _ in line)


def cut(line: list[Entry], n_chars: int) -> list[Entry]:
    """The line after its first n_chars characters (zero-width entries among them go with the text after)."""
    seen = 0
    for i, (ch, _) in enumerate(line):
        if seen >= n_chars:
            return line[i:]
        seen += len(ch)
    return []


def blocks_of(entries: list[Entry]) -> list[Block]:
    """Block structure, line by line: a blank line ends a paragraph; a line that starts no block of its own
    continues the paragraph or list item before it (its line break kept)."""
    blocks: list[Block] = []
    open_block: Block | None = None  # a paragraph, item or quote that the next plain line continues
    fence: tuple[Block, str] | None = None
    for line, newline in lines_of(entries):
        text = text_of(line)
        if fence is not None:  # inside a code block: every line as it is, up to the closing fence
            if FENCE.match(text) and text.strip().startswith(fence[1]) and not text.strip().strip(fence[1][0]):
                fence = None
            else:
                add_line(fence[0], line, newline)
            continue
        block, rest = start_of(line, text)
        if block is None and not text.strip():
            open_block = None
            continue
        if block is None and open_block is not None:
            add_line(open_block, line, newline)
            continue
        if block is None:
            block, rest = Block("p"), line
        blocks.append(block)
        if block.kind == "code":
            fence = (block, FENCE.match(text).group(1))
            open_block = None
            continue
        add_line(block, rest, newline)
        open_block = block if block.kind in ("p", "ul", "ol", "quote") else None
    return blocks


def add_line(block: Block, line: list[Entry], newline: Entry | None) -> None:
    """A line into a block, after a break that keeps the newline entry that ended the line before."""
    if block.lines:
        block.breaks.append(block.pending)
    block.lines.append(line)
    block.pending = newline


def start_of(line: list[Entry], text: str) -> tuple[Block | None, list[Entry]]:
    """The block a line starts, with the entries after its marker; (None, line) for a plain line."""
    if FENCE.match(text):
        return Block("code"), []
    if m := HEADING.match(text):
        return Block("h", level=len(m.group(1))), cut(line, m.end())
    if RULE.match(text):
        return Block("rule"), []
    if m := BULLET.match(text):
        return Block("ul", level=len(m.group(1))), cut(line, m.end())
    if m := ORDERED.match(text):
        return Block("ol", level=len(m.group(1)), number=int(m.group(2))), cut(line, m.end())
    if m := QUOTE.match(text):
        return Block("quote"), cut(line, m.end())
    return None, line


# ------------------------------------------------------------------------------------------------ inline


def is_space(ch: str) -> bool:
    return ch == "" or ch.isspace()


def is_punct(ch: str) -> bool:
    return ch != "" and unicodedata.category(ch)[0] in "PS"


def inline_styles(entries: list[Entry]) -> list[tuple[bool, frozenset]]:
    """For each entry: (hidden, styles). Backslash escapes, code spans, then `*` and `_` emphasis by CommonMark's
    flanking rules: a run opens where text follows it and closes where text precedes it; `_` inside a word does
    neither. An opener and a closer of the same character pair up, two at a time (bold) or one (italic)."""
    chars = [ch for ch, _ in entries]
    n = len(chars)
    hidden, literal = [False] * n, [False] * n
    styles: list[set] = [set() for _ in range(n)]
    for i in range(n - 1):
        if chars[i] == "\\" and not literal[i] and len(chars[i + 1]) == 1 and chars[i + 1] in ASCII_PUNCT:
            hidden[i] = literal[i + 1] = True
    code_spans(chars, hidden, literal, styles)
    emphasis(chars, hidden, literal, styles)
    return [(hidden[i], frozenset(styles[i])) for i in range(n)]


ASCII_PUNCT = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def runs(chars: list[str], literal: list[bool], marks: str) -> list[tuple[int, int]]:
    """(start, length) of each run of one of `marks` that no escape or code span made literal."""
    out, i = [], 0
    while i < len(chars):
        if chars[i] in marks and not literal[i]:
            j = i
            while j < len(chars) and chars[j] == chars[i] and not literal[j]:
                j += 1
            out.append((i, j - i))
            i = j
        else:
            i += 1
    return out


def code_spans(chars, hidden, literal, styles) -> None:
    """`code`: a backtick run and the next run of the same length; what lies between is code, taken literally."""
    spans = runs(chars, literal, "`")
    used = set()
    for a, (start, length) in enumerate(spans):
        if a in used:
            continue
        close = next((b for b in range(a + 1, len(spans)) if spans[b][1] == length and b not in used), None)
        if close is None:
            continue
        used |= set(range(a, close + 1))
        end = spans[close][0]
        for i in range(start, start + length):
            hidden[i] = literal[i] = True
        for i in range(end, end + length):
            hidden[i] = literal[i] = True
        for i in range(start + length, end):
            literal[i] = True
            styles[i].add("code")


def flanking(chars: list[str], start: int, length: int) -> tuple[bool, bool]:
    """Can this delimiter run open, and can it close (CommonMark's left- and right-flanking rules)?"""
    before = next((c for c in reversed(chars[:start]) if c != ""), "")
    after = next((c for c in chars[start + length:] if c != ""), "")
    left = not is_space(after) and (not is_punct(after) or is_space(before) or is_punct(before))
    right = not is_space(before) and (not is_punct(before) or is_space(after) or is_punct(after))
    if chars[start] == "_":
        return left and (not right or is_punct(before)), right and (not left or is_punct(after))
    return left, right


def emphasis(chars, hidden, literal, styles) -> None:
    openers: list[list[int]] = []  # [char index of the run's start, characters left, original length]
    for start, length in runs(chars, literal, "*_"):
        can_open, can_close = flanking(chars, start, length)
        left = length
        while can_close and left:
            k = next((k for k in range(len(openers) - 1, -1, -1) if chars[openers[k][0]] == chars[start]
                      and not ((can_open or openers[k][3]) and (openers[k][2] + length) % 3 == 0
                               and not (openers[k][2] % 3 == 0 and length % 3 == 0))), None)
            if k is None:
                break
            o_start, o_left, _, _ = openers[k]
            use = 2 if o_left >= 2 and left >= 2 else 1
            first = start + length - left  # the closer's characters not used yet
            for i in range(o_start + o_left - use, o_start + o_left):
                hidden[i] = True
            for i in range(first, first + use):
                hidden[i] = True
            for i in range(o_start + o_left, first):
                styles[i].add("b" if use == 2 else "i")
            openers[k][1] -= use
            left -= use
            del openers[k + 1:]  # delimiters between a matched pair stay text
            if openers[k][1] == 0:
                del openers[k]
        if can_open and left:
            openers.append([start, left, length, can_close])


def inline_html(entries: list[Entry], chip: Chip, marks: list[tuple[bool, frozenset]] | None = None) -> str:
    """A block's text: runs of one key and one style, each drawn by `chip`; the markup characters left out.
    marks: each entry's (hidden, styles), where not inline_styles'."""
    out, run_key, run_style, run_text, started = [], None, None, [], False
    for (ch, key), (hide, style) in zip(entries, marks or inline_styles(entries), strict=True):
        if hide:
            continue
        if started and (key, style) == (run_key, run_style) and ch != "" and run_text and run_text[-1] != "":
            run_text.append(ch)
            continue
        if started:
            out.append(chip(run_key, "".join(run_text), tuple(STYLE[s] for s in sorted(run_style))))
        run_key, run_style, run_text, started = key, style, [ch], True
    if started:
        out.append(chip(run_key, "".join(run_text), tuple(STYLE[s] for s in sorted(run_style))))
    return "".join(out)


def joined(block: Block) -> list[Entry]:
    """A block's lines as one entry list, with the newlines between them (drawn as line breaks)."""
    out: list[Entry] = []
    for i, line in enumerate(block.lines):
        if i:
            out.append(block.breaks[i - 1] or ("\n", None))
        out += line
    return out


# ------------------------------------------------------------------------------------------------ the page


def markdown_html(entries: list[Entry], chip: Chip) -> str:
    """The entries drawn as Markdown blocks (see the module's docstring)."""
    out: list[str] = []
    lists: list[tuple[str, int]] = []  # the open lists, outermost first: (tag, indent); each has an open <li>
    for block in blocks_of(entries):
        if block.kind in ("ul", "ol"):
            while lists and (block.kind, block.level) != lists[-1] and block.level <= lists[-1][1]:
                out.append(f"</li></{lists.pop()[0]}>")
            if lists and lists[-1] == (block.kind, block.level):
                out.append("</li>")
            else:
                out.append(f"<{block.kind}>")
                lists.append((block.kind, block.level))
            value = f' value="{block.number}"' if block.kind == "ol" else ""
            out.append(f"<li{value}>{inline_html(joined(block), chip)}")
            continue
        while lists:
            out.append(f"</li></{lists.pop()[0]}>")
        out.append(block_html(block, chip))
    while lists:
        out.append(f"</li></{lists.pop()[0]}>")
    return "".join(out)


def block_html(block: Block, chip: Chip) -> str:
    if block.kind == "rule":
        return "<hr>"
    if block.kind == "code":
        entries = joined(block)
        code = inline_html(entries, chip, [(False, frozenset({"code"}))] * len(entries))
        return f'<pre class="sd-md-pre">{code}</pre>'
    inner = inline_html(joined(block), chip)
    if block.kind == "h":
        return f'<p class="sd-md-h sd-md-h{block.level}">{inner}</p>'
    if block.kind == "quote":
        return f"<blockquote><p>{inner}</p></blockquote>"
    return f"<p>{inner}</p>"
