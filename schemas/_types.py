"""Constrained scalar types shared by every wire struct, and the wire limits.

Validation lives in the types, so a violating message fails to decode with an
error that names the field (msgspec: "Expected `int` <= 4294967295 - at `$.accepted`").
The limits are enforced once, at decode, for every message kind; everything the
worker builds downstream (sums, partials, dead letters) is bounded by construction.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: Largest counter and histogram bin (2^32 - 1). No real generation comes near it, and
#: every sum the worker can hold stays far inside a 64-bit wire integer.
MAX_COUNTER = 2**32 - 1
#: Most histogram bins (SGLang's histogram has ``num_draft_tokens + 1`` bins).
MAX_BINS = 1024
#: Longest id (batch, session, generation, sample, state hash, producer, run) and
#: weight_version and task, in characters: keeps every output far below Kafka's message limit.
MAX_ID = 1024

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]
Counter = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNTER)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNTER)]
#: accept_histogram[i] = verify steps that accepted i drafts; bounded length.
Histogram = Annotated[list[Counter], msgspec.Meta(max_length=MAX_BINS)]
