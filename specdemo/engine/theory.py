"""Closed forms of speculative sampling's speed, and alpha estimated from a run.

Owns the formulas of Leviathan et al. 2023 (arXiv:2211.17192, section 3): with acceptance rate alpha and K drafts,
a round emits E = (1 - alpha^(K+1)) / (1 - alpha) tokens on average (Theorem 3.8), and with a draft/target cost ratio
c the walltime improvement is E / (c K + 1) (Theorem 3.11). It also offers a refined form that uses the measured
cost of a (K+1)-token verify instead of assuming it equals one target step. No torch, no models.
"""

from __future__ import annotations

from .events import Round, Step, acceptance


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha); k + 1 when alpha == 1."""
    assert 0.0 <= alpha <= 1.0 and k >= 0, (alpha, k)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected speedup over target-only decoding: E(alpha, k) / (c k + verify_cost).

    c = t_draft / t_target per token; verify_cost = t_verify(k+1 tokens) / t_target(1 token), 1 in the paper's model.
    """
    assert c >= 0 and verify_cost > 0, (c, verify_cost)
    return expected_tokens_per_round(alpha, k) / (c * k + verify_cost)


def best_k(alpha: float, c: float, k_max: int = 16, verify_cost=None) -> tuple[int, float]:
    """The K in 1..k_max with the highest predicted speedup. verify_cost may be a function of K."""
    scores = {
        k: predicted_speedup(alpha, k, c, verify_cost(k) if callable(verify_cost) else (verify_cost or 1.0))
        for k in range(1, k_max + 1)
    }
    k = max(scores, key=scores.get)
    return k, scores[k]


def measure(rounds: list[Round], steps: list[Step], k: int | None = None) -> dict:
    """alpha and the cost model, measured from speculative rounds and target-only steps timed in the same run.

    alpha_empirical, alpha_overlap: as events.acceptance computes them, over the positions the target judged
      (accepted / (K rounds) would count the never-judged drafts after a rejection).
    c: one draft step / one cached target step. verify_cost: one (k+1)-token target forward / one target step,
      over the rounds that drafted the full k (all rounds when k is None).
    """
    assert rounds and steps, "need speculative rounds and baseline steps"
    a = acceptance(rounds)
    full = [r for r in rounds if k is None or r.k == k] or rounds
    t_target = sum(s.step_ms for s in steps) / len(steps)
    t_draft = sum(r.draft_ms for r in rounds) / a["drafted"] if a["drafted"] else 0.0
    t_verify = sum(r.verify_ms for r in full) / len(full)
    return {
        "alpha_empirical": a["alpha_empirical"],
        "alpha_overlap": a["alpha_overlap"],
        "t_target_ms": t_target,
        "t_draft_ms": t_draft,
        "t_verify_ms": t_verify,
        "c": t_draft / t_target,
        "verify_cost": t_verify / t_target,
    }
