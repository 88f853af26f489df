"""The events that the decoding loops yield: the one contract between the engine and everything that shows it.

Owns plain dataclasses and their JSON form (`to_dict`, and `from_dict` to read a saved trace back). The speculative
loop yields one `Round` per target call, the baseline yields one `Step` per token; `Trace` collects either and
computes the run's metrics. Nothing here touches torch, gradio or HTML, so the UI, the plots, the CLI and the
benchmark all read the same objects.

Labels of the tokens in a round, in display order:
  accepted  - a draft token the target kept (r < min(1, p/q));
  rejected  - the draft token that failed the test; shown struck through, NOT part of the output;
  resampled - drawn from norm(max(0, p - q)) right after a rejection; part of the output;
  bonus     - drawn from the target's own distribution after all K drafts were accepted; part of the output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from .captions import round_caption

LABELS = ("accepted", "rejected", "resampled", "bonus")
OUTPUT_LABELS = ("accepted", "resampled", "bonus")


def own_fields(cls, d: dict) -> dict:
    """The entries of a JSON dict that are fields of the dataclass `cls` (the JSON form adds derived entries, such
    as a round's caption or a trace's metrics, which are computed again from the fields)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass
class Candidate:
    """One entry of a position's top list: a token with its target and draft probabilities."""

    token_id: int
    text: str
    p: float  # p_target(token), warped
    q: float  # q_draft(token), warped


@dataclass
class Token:
    """One token as shown to a person. p/q/r/accept_prob are None where they do not apply (e.g. a bonus has no q)."""

    token_id: int
    text: str
    label: str
    position: int  # 1-based draft position within the round (K+1 for a bonus)
    p: float | None = None
    q: float | None = None
    r: float | None = None
    accept_prob: float | None = None


@dataclass
class DraftPosition:
    """What the draft proposed at one position and how the target judged it.

    Positions after the first rejection were drafted but never judged (`checked` is False).
    `overlap` = sum_x min(p, q): the chance this position is accepted, averaged over the draft's choice;
    the residual at this position is max(0, p - q) / (1 - overlap).
    """

    position: int
    token_id: int
    text: str
    q: float
    p: float
    r: float
    accept_prob: float
    overlap: float
    checked: bool
    accepted: bool
    top: list[Candidate] = field(default_factory=list)


@dataclass
class TreeNode:
    """One node of a round's draft tree (tree.py), in breadth-first order; parent -1 is the last fixed token."""

    id: int
    token_id: int
    text: str
    parent: int
    depth: int
    head_p: float  # the head's probability of this token given its parent (its unwarped softmax)
    p: float  # the target's warped p of this token at its parent
    on_path: bool  # the target's walk went through this node (its token is kept)
    q: float | None = None  # a sampled child (walk.walk_sampled): the draft probability it was tested with, the
    #                         head's warped q at its parent without the siblings drawn before it; None for a top-k
    #                         child, which was chosen, not drawn
    accept_prob: float = 0.0  # its chance to be kept when tested: p for a top-k child, min(1, r/q) for a sampled
    #                           one (r: the parent's residual after the siblings before it were refused)
    copied: bool = False  # grafted by prompt lookup (SpecConfig.tree_lookup), not proposed by the head (head_p 0)


@dataclass
class Round:
    """One speculative round: K drafts, one target call, the verdict, and its timing.

    A "fallback" round proposed nothing (prompt lookup found no match): it is one plain target step, k = 0, and
    its single token is labelled bonus.
    """

    index: int
    k: int  # drafts proposed this round (may be below the run's K near the token budget)
    prefix_len: int  # tokens fixed (prompt + generated) before this round
    drafts: list[DraftPosition]
    tokens: list[Token]  # display order: accepted..., then rejected + resampled, or a bonus
    n_accepted: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    elapsed_s: float  # the run's own time so far, end of this round (excludes the consumer's pauses)
    lossy: bool = False
    stop_reason: str | None = None  # "eos" or "max_new_tokens" if the run ended in this round
    bonus_top: list[Candidate] = field(default_factory=list)  # target's top tokens at the bonus position
    source: str = "draft"  # who proposed: "draft" (the draft model), "eagle" (the feature head), "lookup" (copied),
    #                        "tree" (the head's draft tree), "fallback" (nothing to copy), "prefill" (eagle's first
    #                        round, before any target features)
    copied_from: int | None = None  # lookup: index in prompt + output of the first copied token
    ngram: int | None = None  # lookup: the size of the n-gram that matched
    unsure: tuple[float, float] | None = None  # eagle: its confidence stop ended the round early (drafters.Proposal)
    tree: list[TreeNode] | None = None  # source "tree": every drafted node; k is their number, n_accepted the path's
    head: str | None = None  # eagle/tree with a published head (an EAGLE-3 checkpoint): its name; None for our own

    @property
    def output(self) -> list[Token]:
        return [t for t in self.tokens if t.label in OUTPUT_LABELS]

    @property
    def ms(self) -> float:
        """The round's own time: its draft, its verify and the loop's bookkeeping, in milliseconds."""
        return self.draft_ms + self.verify_ms + self.overhead_ms

    @property
    def caption(self) -> str:
        """The round in plain English words, for the JSON trace and the CLI: 'draft proposed 4; target kept 2,
        rejected 1 and resampled 1'. It is the page's English caption (captions.round_caption, from the message
        catalogue), so the two never drift apart."""
        return round_caption(self, "en")

    def to_dict(self) -> dict:
        out = asdict(self) | {"caption": self.caption}
        for node in out["tree"] or []:  # "copied" only where it is true: a tree without a lookup branch reads as before
            if not node["copied"]:
                del node["copied"]
        if out["head"] is None:  # only a published head's rounds name it: our own heads' traces read as before
            del out["head"]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Round:
        """The round that `to_dict` wrote (a recorded run's JSON trace)."""
        out = own_fields(cls, d)
        out["drafts"] = [DraftPosition(**own_fields(DraftPosition, x) | {
            "top": [Candidate(**c) for c in x.get("top", [])]}) for x in d["drafts"]]
        out["tokens"] = [Token(**own_fields(Token, t)) for t in d["tokens"]]
        out["bonus_top"] = [Candidate(**c) for c in d.get("bonus_top", [])]
        if out.get("unsure") is not None:
            out["unsure"] = tuple(out["unsure"])
        if out.get("tree") is not None:
            out["tree"] = [TreeNode(**own_fields(TreeNode, n)) for n in out["tree"]]
        return cls(**out)


def acceptance(rounds: list[Round], position: int | None = None) -> dict:
    """How often the target kept the drafts of `rounds`: the one place alpha and the acceptance rate are computed.

    drafted, accepted: drafts proposed and kept, over all rounds; acceptance_rate = accepted / drafted counts the
      drafts after a rejection, which were never judged, as not kept.
    judged: the positions the target tested (a round that rejects at position t judged t positions).
    alpha_empirical: accepted / judged, the maximum-likelihood estimate of a constant alpha under the paper's i.i.d.
      model. alpha_overlap: the mean of sum_x min(p, q) over the judged positions, the exact acceptance probability
      there. With `position` (1-based), judged and both alphas count that draft position only.
    Each ratio is 0.0 where its denominator is.
    """
    judged = [d for r in rounds for d in r.drafts if d.checked and position in (None, d.position)]
    drafted = sum(r.k for r in rounds)
    accepted = sum(r.n_accepted for r in rounds)
    return {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "judged": len(judged),
        "alpha_empirical": sum(d.accepted for d in judged) / len(judged) if judged else 0.0,
        "alpha_overlap": sum(d.overlap for d in judged) / len(judged) if judged else 0.0,
    }


@dataclass
class Step:
    """One token of the target-only baseline."""

    index: int
    token: Token
    step_ms: float
    elapsed_s: float  # the run's own time so far (excludes the consumer's pauses)
    stop_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Step:
        return cls(**own_fields(cls, d) | {"token": Token(**own_fields(Token, d["token"]))})


@dataclass
class Trace:
    """A whole run: the settings, the events, the output and its metrics."""

    mode: str  # "speculative" or "baseline"
    prompt: str
    prompt_ids: list[int]
    settings: dict
    rounds: list[Round] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    text: str = ""
    wall_s: float = 0.0
    stop_reason: str | None = None

    @property
    def output_ids(self) -> list[int]:
        if self.mode == "speculative":
            return [t.token_id for r in self.rounds for t in r.output]
        return [s.token.token_id for s in self.steps]

    def metrics(self) -> dict:
        n_tokens = len(self.output_ids)
        out = {
            "new_tokens": n_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": n_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "lossy": bool(self.settings.get("lenience", 1.0) < 1.0),
        }
        if self.mode == "baseline":
            out["target_calls"] = len(self.steps)
            return out
        a = acceptance(self.rounds)
        out |= {
            "rounds": len(self.rounds),
            "target_calls": len(self.rounds),
            "target_calls_saved": max(0, n_tokens - len(self.rounds)),
            "drafted": a["drafted"],
            "accepted": a["accepted"],
            "acceptance_rate": a["acceptance_rate"],
            # mean tokens emitted per target call (accepted drafts + the resampled or bonus token)
            "mean_accepted_length": n_tokens / len(self.rounds) if self.rounds else 0.0,
            # alpha, two estimates over the positions the target judged (see acceptance)
            "alpha_empirical": a["alpha_empirical"],
            "alpha_overlap": a["alpha_overlap"],
            "draft_ms": sum(r.draft_ms for r in self.rounds),
            "verify_ms": sum(r.verify_ms for r in self.rounds),
            "overhead_ms": sum(r.overhead_ms for r in self.rounds),
        }
        return out

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "settings": self.settings,
            "text": self.text,
            "token_ids": self.output_ids,
            "stop_reason": self.stop_reason,
            "metrics": self.metrics(),
            "rounds": [r.to_dict() for r in self.rounds],
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        """The trace that `to_dict` wrote: its events, settings, text and run time (a recorded run's JSON)."""
        return cls(d["mode"], d["prompt"], list(d["prompt_ids"]), dict(d["settings"]),
                   rounds=[Round.from_dict(r) for r in d.get("rounds", [])],
                   steps=[Step.from_dict(s) for s in d.get("steps", [])], text=d.get("text", ""),
                   wall_s=d["metrics"]["wall_s"], stop_reason=d.get("stop_reason"))
