"""The advice, as a library (issue 45): which draft budget a run's own acceptance
histograms favour, whether to speculate at all, the engine settings that apply it, and
when a stale draft is worth refreshing (docs/advise.md).

Arithmetic here, printing at the edge: ``specmeter advise`` reads metrics, calls
``advise`` and prints what this package returns; a trainer calls the same function on the
``BatchMetrics`` it already holds, with no command line imported::

    from specmeter.streams.advice import advise, engine_settings

    advice = advise(metrics, draft_cost=0.1)         # a typed, frozen msgspec Struct
    budget = advice.curves[0].recommendation.budget  # 0: turn speculation off
    settings = engine_settings(budget)["sglang"]     # the flags that apply it

``advice.as_document()`` (``advice_json``: its bytes) is the JSON document ``advise
--json`` prints; ``advice_notes`` and ``advice_tables`` the terminal's lines and tables as
plain strings and rows; ``advice_svg`` the ``--plot`` picture. No Kafka, no terminal: the
command reads the metrics topic, this package never does.
"""

from ._advise import advise
from ._budget import (
    SPEEDUP_DECIMALS,
    BudgetPoint,
    Recommendation,
    budget_curve,
    engine_settings,
    recommend,
    recommendation_text,
)
from ._model import BREAKDOWNS, CAVEAT, Advice, AdviceError, Curve, advice_json
from ._plot import advice_svg
from ._read import metrics_from_lines
from ._staleness import LagPoint, RefreshPlan, Staleness, refresh_interval, staleness
from ._words import ENGINES, TextTable, Verbatim, advice_notes, advice_tables

__all__ = [
    "advise",
    "Advice",
    "AdviceError",
    "BudgetPoint",
    "Curve",
    "Recommendation",
    "LagPoint",
    "Staleness",
    "RefreshPlan",
    "TextTable",
    "Verbatim",
    "BREAKDOWNS",
    "CAVEAT",
    "ENGINES",
    "SPEEDUP_DECIMALS",
    "budget_curve",
    "recommend",
    "recommendation_text",
    "engine_settings",
    "staleness",
    "refresh_interval",
    "metrics_from_lines",
    "advice_json",
    "advice_notes",
    "advice_tables",
    "advice_svg",
]
