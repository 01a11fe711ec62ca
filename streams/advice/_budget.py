"""The budget curve and the recommendation (docs/advise.md, docs/contract.md §3.5).

A summed acceptance histogram H gives the tokens per verify step with a budget of k draft
tokens, ``E_k = (S + sum_i min(i, k) * H[i]) / S`` (S = sum(H)), for k = 1 .. len(H) - 1.
Given the cost c of one draft step relative to one target forward pass, a step with budget
k costs ``1 + c * k`` target passes, so the expected speedup over no speculation is
``E_k / (1 + c * k)``. Budget 0 (no speculation: 1 token per step, speedup 1) is always a
candidate; budgets whose speedups print the same (``SPEEDUP_DECIMALS``) tie and the
smallest is recommended. Pure arithmetic and its words: no terminal, no Kafka.
"""

from __future__ import annotations

import msgspec

from ..core.merge import tokens_per_verify_by_budget

__all__ = [
    "SPEEDUP_DECIMALS",
    "BudgetPoint",
    "Recommendation",
    "budget_curve",
    "recommend",
    "recommendation_text",
    "engine_settings",
    "printed",
    "budgets_text",
]

#: speedups are printed with this many decimals; budgets whose speedups print the same tie
SPEEDUP_DECIMALS = 3


class BudgetPoint(msgspec.Struct, frozen=True):
    """One candidate budget k: tokens per verify step, and the speedup when a draft cost is given."""

    budget: int
    tokens_per_verify: float
    speedup: float | None = None


class Recommendation(msgspec.Struct, frozen=True):
    """The budget to run (0: speculation off), and why."""

    budget: int
    speedup: float
    #: every budget whose speedup prints the same as the recommended one's, smallest first
    #: (the recommended budget among them); one budget when nothing ties
    tied: list[int]
    #: the recommended budget is the largest the histograms cover (the one the fleet ran):
    #: a larger one might pay more, but that is beyond the data
    at_edge: bool
    #: the greatest speedup of a budget k >= 1 (what speculating would give at best)
    best_speculating: BudgetPoint | None = None

    @property
    def speculate(self) -> bool:
        return self.budget > 0

    @property
    def others_tied(self) -> list[int]:
        """The budgets that tie with the recommended one (``tied`` without it), smallest first."""
        return [k for k in self.tied if k != self.budget]


def budget_curve(histogram: list[int], draft_cost: float | None = None) -> list[BudgetPoint]:
    """Tokens per verify step for every budget k >= 1 a summed histogram can speak for, and
    with ``draft_cost`` the expected speedup ``E_k / (1 + draft_cost * k)``; empty when the
    histogram has fewer than two bins or no step."""
    curve = tokens_per_verify_by_budget(histogram) or []
    return [
        BudgetPoint(k, tokens, None if draft_cost is None else tokens / (1 + draft_cost * k))
        for k, tokens in enumerate(curve, start=1)
    ]


def printed(speedup: float) -> str:
    return f"{speedup:.{SPEEDUP_DECIMALS}f}"


def recommend(points: list[BudgetPoint]) -> Recommendation:
    """The budget to run among 0 (no speculation: speedup 1) and the points' budgets.

    The greatest speedup wins; budgets whose speedups print the same (``SPEEDUP_DECIMALS``
    decimals) tie, and the smallest of them is recommended: the same speedup for fewer
    draft tokens per step. Budget 0 is among them, so a budget that does not beat
    decoding without speculation by a printed digit is never recommended.

    Raises:
        ValueError: a point without a speedup (no draft cost).
    """
    speedups = _speedups(points)
    tied = _tied_at_the_top(speedups)
    best_speculating = max(points, key=lambda p: (speedups[p.budget], -p.budget), default=None)
    return Recommendation(
        budget=tied[0],
        speedup=speedups[tied[0]],
        tied=tied,
        at_edge=bool(points) and tied[0] == points[-1].budget,
        best_speculating=best_speculating,
    )


def _speedups(points: list[BudgetPoint]) -> dict[int, float]:
    """What the recommendation ranks: each budget's speedup, budget 0 (no speculation) at 1.

    Raises:
        ValueError: a point without a speedup (no draft cost).
    """
    if any(p.speedup is None for p in points):
        raise ValueError("recommend() needs every point's speedup (a draft cost)")
    return {0: 1.0, **{p.budget: float(p.speedup or 0.0) for p in points}}


def _tied_at_the_top(speedups: dict[int, float]) -> list[int]:
    """The budgets whose speedups print the same as the greatest, smallest first."""
    top = printed(max(speedups.values()))
    return sorted(k for k, value in speedups.items() if printed(value) == top)


def recommendation_text(r: Recommendation) -> str:
    """The recommendation in one sentence or two: what to run, the ties, the edge of the data."""
    return _run_text(r) if r.speculate else _off_text(r)


def _off_text(r: Recommendation) -> str:
    """Speculation off: nothing measured, budgets that only tie budget 0, or none that beats it."""
    best = r.best_speculating
    if best is None:
        return "no budget was measured: turn speculative decoding off"
    if r.others_tied:
        return _tie_off_text(r)
    return (
        f"no budget beats decoding without speculation (the best, k={best.budget}, gives "
        f"{printed(best.speedup or 0.0)}×): turn speculative decoding off"
    )


def _tie_off_text(r: Recommendation) -> str:
    """Budgets that only tie budget 0: off all the same, the same speed for no draft."""
    others = budgets_text(r.others_tied)
    return (
        f"no budget beats decoding without speculation: {others} only tie it at {printed(r.speedup)}× "
        "(equal within the printed precision); turn speculative decoding off, which gives the same "
        "speed without the draft's work and memory"
    )


def _run_text(r: Recommendation) -> str:
    """A budget to run, its ties, and whether it is the edge of the data."""
    text = f"run k={r.budget} draft tokens per step: {printed(r.speedup)}× over decoding without speculation"
    if len(r.tied) > 1:
        text += (
            f"; {budgets_text(r.tied)} tie at {printed(r.speedup)}× (equal within the printed precision), "
            f"and the smaller, k={r.budget}, gives the same speedup for fewer draft tokens per step"
        )
    if r.at_edge:
        text += (
            f"; k={r.budget} is the largest budget the histograms cover (the one the fleet ran): whether a larger "
            "one pays more is beyond the data — run the fleet at a larger budget to measure it"
        )
    return text


def budgets_text(budgets: list[int]) -> str:
    names = [f"k={k}" for k in budgets]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def engine_settings(budget: int) -> dict[str, str]:
    """The settings that run a chain drafter at ``budget`` draft tokens per step, per engine
    (docs/advise.md, "Engine settings"); for budget 0, how to turn speculation off.

    SGLang (python/sglang/srt/server_args.py) sets ``speculative_num_draft_tokens`` to
    ``speculative_num_steps + 1`` whenever ``speculative_eagle_topk`` is 1 (a chain): k draft
    steps verify k + 1 tokens. vLLM's budget is ``num_speculative_tokens`` in
    ``--speculative-config``; TensorRT-LLM's is ``max_draft_len`` in its speculative config.
    """
    if budget < 0:
        raise ValueError(f"a budget is >= 0, not {budget}")
    if budget == 0:
        return {
            "sglang": "leave out --speculative-algorithm and the other --speculative-* flags",
            "vllm": "leave out --speculative-config",
            "tensorrt_llm": "leave out speculative_config (no max_draft_len)",
        }
    return {
        "sglang": (
            f"--speculative-num-steps {budget} --speculative-eagle-topk 1 --speculative-num-draft-tokens {budget + 1}"
        ),
        "vllm": f"--speculative-config '{{..., \"num_speculative_tokens\": {budget}}}' (keep your method and model)",
        "tensorrt_llm": (
            f"max_draft_len={budget} in speculative_config (e.g. Eagle3DecodingConfig(max_draft_len={budget}))"
        ),
    }
