"""The drawing of a tree round (strategy "tree"): every node the head proposed, the path the target's walk
kept, the refused children and the branches it never visited, as an escaped SVG with a legend. Built from events
only; the page's CSS for it is TREE_CSS, which ui.py adds beside style.CSS."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from specdemo.engine.captions import round_caption, said, tree_end
from specdemo.engine.events import Round, Token
from specdemo.i18n import tr

from .render import KIND_STYLE, PIECE, esc, fmt, kept_texts, kind_colours

TREE_CSS = """
.sd-tree { margin: 6px 0; }
.sd-tree-title { font-size: 13px; color: #4B5563; margin-bottom: 2px; }  /* 7.2:1, as style.py's keys hint */
.dark .sd-tree-title { color: var(--body-text-color-subdued); }
.sd-tree-legend { display: flex; flex-wrap: wrap; gap: 4px 12px; font-size: 12px; margin-bottom: 4px; }
.sd-tree-sw { display: inline-block; width: 1.6em; height: 0.9em; border-radius: 3px; vertical-align: middle;
  margin-right: 4px; text-align: center; font: 700 0.9em/0.9em sans-serif; color: #D55E00; }
.sd-tree-scroll { overflow: auto; max-height: 480px; }
/* a scrollbar drawn always, so that a tree taller than its box says so where the system's scrollbars only show while
   scrolling (macOS, phones): a styled ::-webkit-scrollbar is never an overlay in Chromium and Safari; Firefox takes
   the standard properties. The thumb is 3.8:1 on its track */
.sd-tree-scroll::-webkit-scrollbar { width: 12px; height: 12px; }
.sd-tree-scroll::-webkit-scrollbar-track { background: #E5E7EB; border-radius: 6px; }
.sd-tree-scroll::-webkit-scrollbar-thumb { background: #6B7280; border-radius: 6px; border: 2px solid #E5E7EB; }
.sd-tree-scroll::-webkit-scrollbar-corner { background: transparent; }
@supports not selector(::-webkit-scrollbar) { .sd-tree-scroll { scrollbar-color: #6B7280 #E5E7EB; } }
.sd-tree svg { display: block; width: 100%; height: auto; max-width: var(--w); min-width: min(var(--w), 560px); }
.sd-tree svg text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px; fill: #111;
  white-space: pre; }
.sd-tree-node rect { stroke-width: 1.5; }
.sd-tree-path rect { fill: #009E73; stroke: #009E73; stroke-width: 3; }
.sd-tree-refused rect { fill: #D55E00; stroke: #D55E00; stroke-width: 2; stroke-dasharray: 5 3; }
.sd-tree-mark circle { fill: #fff; stroke: #D55E00; stroke-width: 2; }
.sd-tree svg .sd-tree-mark text { fill: #D55E00; font-family: sans-serif; font-size: 12px; font-weight: 700; }
.sd-chip { display: inline-block; box-sizing: border-box; max-width: 100%; overflow: hidden; text-overflow: ellipsis;
  white-space: nowrap; vertical-align: top; font: 600 12px/16px system-ui, sans-serif; padding: 0 5px;
  border: 1.5px solid #222; border-radius: 4px; background: #fff; color: #111; }
.sd-chip-special { background: #222; color: #fff; }
.sd-tree svg tspan.sd-ws { font-weight: 700; }
.sd-tree svg text.sd-tok-punct { font-size: 19px; font-weight: 700; }
.sd-tree-unused { opacity: 0.4; }
.sd-tree-unused rect { fill: #777; stroke: #888; }
.sd-tree-root rect { fill: #fff; stroke: #555; stroke-width: 2; }
.sd-tree-root .sd-tok-text { font-weight: 700; }
/* the token that ended the round in the reply's colours for its kind (render.KIND_STYLE, style.TOKENS): the
   correction white on navy, the bonus bold black on amber with a dotted dark outline; each text 4.5:1 or more on
   its fill, each fill 3:1 or more on the page (docs/decisions.md, the four kinds on a projector) */
.sd-tree-resampled rect { fill: RES_FILL; stroke: RES_FILL; stroke-width: 3; }
.sd-tree svg .sd-tree-resampled .sd-tok-text { fill: RES_TEXT; }
.sd-tree-bonus rect { fill: BON_FILL; stroke: BON_MARK; stroke-width: 2.5; stroke-dasharray: 2 2; }
.sd-tree svg .sd-tree-bonus .sd-tok-text { fill: BON_TEXT; font-weight: 700; }
.sd-edge { fill: none; stroke: #aaa; stroke-width: 1.5; }
.sd-edge-path { stroke: #009E73; stroke-width: 3.5; }
.sd-edge-refused { stroke: #D55E00; stroke-dasharray: 5 3; }
.sd-edge-unused { opacity: 0.4; }
.sd-edge-end { stroke: RES_FILL; stroke-width: 3; }
.sd-edge-end.sd-edge-bonus { stroke: BON_FILL; }
.sd-present .sd-tree-title, .sd-present .sd-tree-legend { font-size: 17px; }
.sd-present .sd-tree svg { max-width: calc(var(--w) * 1.6); }
.sd-present .sd-tree-scroll { max-height: 60vh; }
/* presenter mode's step screen holds the tree in a 34 vh box (style.PRESENTER): a tall tree is drawn smaller, down to
   4/3 of its own size (its text 18.7 px, a chip's 16 px), so that more of it shows; what is left scrolls. --ar is the
   drawing's width over its height (tree_html) */
.sd-present #sd-step-tokens .sd-tree svg { max-width: min(calc(var(--w) * 1.6),
  max(calc(var(--w) * 4 / 3), calc(34vh * var(--ar)))); }
/* a chip keeps the size its words were measured at (12 px in the drawing's own pixels, scaled with it): presenter
   mode's 16 px floor for HTML text cut "↵ 2 newlines" to "↵ 2 ne…". !important: gradio prefixes each selector in
   that rule's :is() with its container's three classes, which outweighs any plain selector here */
.sd-present .sd-tree .sd-chip { font-size: 12px !important; }
"""
TREE_CSS = kind_colours(TREE_CSS)

TREE_COL, TREE_NODE_W, TREE_NODE_H, TREE_ROW, TREE_PAD = 124, 110, 26, 34, 6  # the drawing's grid, in SVG pixels
# a node's second tooltip line, by what the walk did with it (the root's and the end's own lines say it all)
TREE_TIP_KEY = {"path": "tree.tip_path", "refused": "tree.tip_refused", "unused": "tree.tip_unused",
                "resampled": "tree.tip_resampled", "bonus": "tree.tip_bonus", "root": "tree.tip_root"}
# the drawing's key, with each entry's swatch
TREE_LEGEND_KEY = {"path": "tree.path", "refused": "tree.refused", "unused": "tree.unused",
                   "resampled": "legend.resampled", "bonus": "legend.bonus", "shade": "tree.shade"}
TREE_SWATCH = {"path": "background: #009E73b0; border: 2px solid #009E73",
               "refused": "background: #D55E0060; border: 2px dashed #D55E00",
               "unused": "background: #7773; border: 1px solid #8886",
               "resampled": f"background: {KIND_STYLE['resampled']['fill']}; "
                            f"border: 2px solid {KIND_STYLE['resampled']['fill']}",
               "bonus": f"background: {KIND_STYLE['bonus']['fill']}; border: 2px dotted {KIND_STYLE['bonus']['mark']}",
               "shade": "background: linear-gradient(90deg, #009E7320, #009E73d0)"}
TREE_CHARS = 11  # the characters a node shows (its tooltip has the whole token)


# Tokens that show nothing readable on their own are drawn as chips that name them (issue 44, item 12): a bare "⏎"
# was faint, and a space or an empty token showed nothing at all.
SPECIAL = re.compile(r"<\|[^<>|\s]{1,40}\|>|</?s>|<(unk|pad|bos|eos|mask)>|\[(PAD|CLS|SEP|MASK|UNK)\]")
NEWLINE = re.compile(r"\r\n|\r|\n")
WS_GLYPH = {"newline": "\u21b5", "tab": "\u21e5", "space": "\u2423"}
# catalogue keys, one and several, written out so that tests/test_i18n.py sees every key the code uses
WS_ONE_KEY = {"newline": "tree.chip_newline", "tab": "tree.chip_tab", "space": "tree.chip_space"}
WS_MANY_KEY = {"newline": "tree.chip_newlines", "tab": "tree.chip_tabs", "space": "tree.chip_spaces"}
CHIP_X, CHIP_Y, CHIP_H = 5, 3, 20  # where a chip sits inside its node's box, in SVG pixels


def invisible(c: str) -> bool:
    """Whitespace, a line or paragraph separator, a control or a format character (zero-width space, BOM)."""
    return c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp")


def chip_words(text: str, lang: str | None = None) -> tuple[str, str] | None:
    """What a node shows for a token that has nothing to read on its own: (the chip's words, "special" or "blank");
    None for a token that reads as it is. Special tokens by name (<|im_end|> as "im_end"); an empty token, or a
    piece of a character (U+FFFD), as a piece; a control or format character by its code point; newlines, tabs and
    spaces named and counted ("↵ newline", "␣ 3 spaces"), and a mix of them by their marks and one word ("↵␣ blank").
    The words fit a node's chip at 12 px (tests/test_stage_charts.py measures them in Chromium)."""
    if SPECIAL.fullmatch(text):
        return text.removeprefix("<|").removesuffix("|>"), "special"
    if not text.strip("\ufffd"):
        return f"{PIECE} {tr('tree.chip_piece', lang)}", "blank"
    if not all(invisible(c) for c in text):
        return None
    control = next((c for c in NEWLINE.sub("", text)  # U+2028 and U+2029 separate lines without being spaces
                    if c != "\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if control is not None:
        return tr("tree.chip_control", lang, code=f"U+{ord(control):04X}"), "blank"
    n_newlines, rest = len(NEWLINE.findall(text)), NEWLINE.sub("", text)
    counts = {"newline": n_newlines, "tab": rest.count("\t"), "space": len(rest) - rest.count("\t")}
    kinds = [k for k, n in counts.items() if n]
    if len(kinds) > 1:
        return "".join(WS_GLYPH[k] for k in kinds) + " " + tr("tree.chip_blank", lang), "blank"
    (kind,) = kinds
    n = counts[kind]
    return f"{WS_GLYPH[kind]} {tr(WS_ONE_KEY[kind], lang) if n == 1 else tr(WS_MANY_KEY[kind], lang, n=n)}", "blank"


def chip_svg(words: str, kind: str) -> str:
    """A bordered chip with words in it, inside a node's box: an HTML span in a foreignObject, so that the browser
    sizes the border to the words in whatever font it has (an SVG rect would need their width up front)."""
    return (f'<foreignObject x="{CHIP_X}" y="{CHIP_Y}" width="{TREE_NODE_W - 2 * CHIP_X}" height="{CHIP_H}">'
            f'<span xmlns="http://www.w3.org/1999/xhtml" class="sd-chip sd-chip-{kind}">{esc(words)}</span>'
            f"</foreignObject>")


def token_svg(text: str, lang: str | None = None) -> str:
    """A node's token: a chip (chip_words), or its text cut to TREE_CHARS, escaped, with each newline and tab as a
    bold mark; a lone punctuation mark or symbol larger and bold, so that "," and ";" read from the back."""
    chip = chip_words(text, lang)
    if chip is not None:
        return chip_svg(*chip)
    shown = NEWLINE.sub("\n", text)
    shown = shown if len(shown) <= TREE_CHARS else shown[: TREE_CHARS - 1] + "\u2026"
    marks = {"\n": WS_GLYPH["newline"], "\t": WS_GLYPH["tab"]}
    inner = "".join(f'<tspan class="sd-ws">{marks[c]}</tspan>' if c in marks else esc(c) for c in shown)
    punct = " sd-tok-punct" if len(shown) <= 2 and all(unicodedata.category(c)[0] in "PS" for c in shown) else ""
    return f'<text class="sd-tok-text{punct}" x="7" y="{TREE_NODE_H - 8}">{inner}</text>'


CROSS = "\u00d7"  # a refused child's mark, in its node and in the legend's swatch


def refused_mark() -> str:
    """A refused child's cross, on a white disc at the box's corner: the strike-through that marked it ran into
    one-character tokens (a struck "," read as "-,")."""
    return (f'<g class="sd-tree-mark"><circle cx="{TREE_NODE_W - 2}" cy="2" r="7"/>'
            f'<text x="{TREE_NODE_W - 2}" y="6.5" text-anchor="middle">{CROSS}</text></g>')


@dataclass
class TreeLayout:
    """Where each node of a tree round is drawn. Node ids: the tree's own, -1 for the root (the last fixed token)
    and "end" for the token that ended the round."""

    rnd: Round
    end_tok: Token | None  # the token that ended the round: the target's correction or its bonus at a leaf
    kids: dict  # parent id -> its children's ids, in drawing order
    kind: dict  # node id -> what the walk did with it (TREE_TIP_KEY's keys, or the end token's label)
    xy: dict  # node id -> its top-left corner
    path_text: dict  # a path node's id -> its text as the reply has it (kept_texts)
    width: int = 0
    height: int = 0


def tree_html(rnd: Round, lang: str | None = None, root: str | None = None) -> str:
    """A tree round's draft tree as SVG (empty for other rounds). Depth runs left to right from the root, the last
    fixed token (`root`: its text, where the caller knows it). The target's path runs along the top row in the
    accepted colour, followed by the token that ended the round (the correction in the resampled blue, or the bonus
    at a leaf, bold); the children it refused at the path's end are dashed in vermillion with a cross at the corner
    (no line through the text, which turned a struck "," into "-,"), and the branches it never visited are faded.
    Tokens with nothing to read on their own are chips that name them (chip_words). A node's shade is the head's
    probability; its tooltip gives that and the target's p. Every token's text is escaped."""
    if not rnd.tree:
        return ""
    layout = tree_layout(rnd)
    parts = tree_edges(layout) + [tree_node(layout, nid, lang, root) for nid in layout.xy]  # nodes over edges
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {layout.width} {layout.height}" '
           f'width="{layout.width}" height="{layout.height}" '
           f'style="--w: {layout.width}px; --ar: {layout.width / layout.height:.3f}" role="img" '
           f'aria-label="{esc(round_caption(rnd, lang))}">{"".join(parts)}</svg>')
    return (f'<div class="sd-tree" data-round="{rnd.index}"><div class="sd-tree-title">{esc(tr("tree.title", lang))}'
            f"</div>{tree_legend(lang)}<div class=\"sd-tree-scroll\">{svg}</div></div>")


def tree_layout(rnd: Round) -> TreeLayout:
    """1. children in drawing order: the path first (so it runs straight along the top row), then by head p;
    2. rows: each leaf gets its own, and a node sits on its first child's row; 3. what the walk did with each."""
    nodes, end_tok = rnd.tree, tree_end(rnd)
    end = next((nd.id for nd in reversed(nodes) if nd.on_path), -1)  # the path's last node
    kids: dict = {}
    for nd in sorted(nodes, key=lambda nd: (not nd.on_path, -nd.head_p)):
        kids.setdefault(nd.parent, []).append(nd.id)
    if end_tok is not None:
        kids.setdefault(end, []).insert(0, "end")
    rows: dict = {}
    leaves = iter(range(len(nodes) + 2))

    def place(nid) -> None:
        for kid in kids.get(nid, []):
            place(kid)
        rows[nid] = rows[kids[nid][0]] if kids.get(nid) else next(leaves)

    place(-1)
    depth = {nd.id: nd.depth for nd in nodes} | {-1: 0}
    depth["end"] = depth[end] + 1
    xy = {nid: (TREE_PAD + depth[nid] * TREE_COL, TREE_PAD + rows[nid] * TREE_ROW) for nid in rows}
    refused_at = end if end_tok is not None and end_tok.label == "resampled" else None
    kind = {nid: "root" if nid == -1 else end_tok.label if nid == "end" else "path" if nodes[nid].on_path
            else "refused" if nodes[nid].parent == refused_at else "unused" for nid in xy}
    width = max(x for x, _ in xy.values()) + TREE_NODE_W + 2 * TREE_PAD
    height = (max(rows.values()) + 1) * TREE_ROW - (TREE_ROW - TREE_NODE_H) + 2 * TREE_PAD
    path_text = dict(zip([nd.id for nd in nodes if nd.on_path], kept_texts(rnd)))
    return TreeLayout(rnd, end_tok, kids, kind, xy, path_text, width, height)


def tree_edges(layout: TreeLayout) -> list[str]:
    """A curve from each parent's right side to each child's left side, styled by what the walk did with the
    child (the end token's edge has a style of its own)."""
    parts = []
    for parent, children in layout.kids.items():
        x1, y1 = layout.xy[parent][0] + TREE_NODE_W, layout.xy[parent][1] + TREE_NODE_H / 2
        for kid in children:
            x2, y2 = layout.xy[kid][0], layout.xy[kid][1] + TREE_NODE_H / 2
            kind = {"path": "path", "refused": "refused", "unused": "unused"}.get(layout.kind[kid],
                                                                                  f"end sd-edge-{layout.kind[kid]}")
            xm = (x1 + x2) / 2
            parts.append(f'<path class="sd-edge sd-edge-{kind}" d="M{x1:.0f},{y1:.0f} C{xm:.0f},{y1:.0f} '
                         f'{xm:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"/>')
    return parts


def tree_node(layout: TreeLayout, nid, lang: str | None, root: str | None) -> str:
    """One node: its box (shaded by the head's probability), its text (cut to TREE_CHARS) and its tooltip."""
    kind, (x, y), end_tok = layout.kind[nid], layout.xy[nid], layout.end_tok
    y_end = said(end_tok.text, lang) if end_tok is not None else ""
    if nid == -1:
        text = "\u2026" if root is None else root
        tip, shade = tr(TREE_TIP_KEY[kind], lang, x=text if root is None else said(root, lang)), None
    elif nid == "end":
        text = end_tok.text
        tip, shade = tr(TREE_TIP_KEY[kind], lang, y=y_end, p=fmt(end_tok.p, lang)), None
    else:
        nd = layout.rnd.tree[nid]
        text = layout.path_text.get(nid, nd.text)  # a path node as the reply has it (kept_texts)
        shade = 0.1 + 0.75 * min(max(nd.head_p, 0.0), 1.0) ** 0.5  # sqrt: small p stay apart
        tip = node_tip(nd, lang) + "\n" + tr(TREE_TIP_KEY[kind], lang, y=y_end)
    style = f' style="fill-opacity: {shade:.2f}"' if shade is not None else ""
    mark = refused_mark() if kind == "refused" else ""
    return (f'<g class="sd-tree-node sd-tree-{kind}" data-node="{"root" if nid == -1 else nid}" '
            f'transform="translate({x},{y})"><title>{esc(tip)}</title>'
            f'<rect width="{TREE_NODE_W}" height="{TREE_NODE_H}" rx="5"{style}/>{token_svg(text, lang)}{mark}</g>')


def node_tip(nd, lang: str | None) -> str:
    """A drafted node's tooltip: who proposed it, its head p and target p, its depth; a sampled child also says what
    it was drawn from and tested with (tree.walk_sampled)."""
    if nd.copied:  # grafted by prompt lookup (tree.graft): the head has no probability for it to show
        tip = tr("tree.tip_copied", lang, x=said(nd.text, lang), p=f"{nd.p:.3g}", d=nd.depth)
    else:
        tip = tr("tree.tip_node", lang, x=said(nd.text, lang), hp=f"{nd.head_p:.3g}", p=f"{nd.p:.3g}", d=nd.depth)
    if nd.q is not None:
        tip += "\n" + tr("tree.tip_drawn", lang, q=f"{nd.q:.3g}", a=f"{nd.accept_prob:.3g}")
    return tip


def tree_legend(lang: str | None = None) -> str:
    """The drawing's key: the path, a refused child, a branch not visited, the two ways a round ends, the shade."""
    items = "".join(f'<span><span class="sd-tree-sw" style="{TREE_SWATCH[kind]}">{CROSS * (kind == "refused")}'
                    f'</span>{esc(tr(key, lang))}</span>' for kind, key in TREE_LEGEND_KEY.items())
    return f'<div class="sd-tree-legend">{items}</div>'
