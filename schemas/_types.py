"""Constrained scalar types shared by every wire struct.

Validation lives in the types, so a violating message fails to decode with an
error that names the field (msgspec: "Expected `int` >= 0 - at `$.accepted`").
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: Counters fit a signed 64-bit integer so that sums stay encodable in msgpack.
MAX_COUNTER = 2**63 - 1

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
Counter = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNTER)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNTER)]
#: accept_histogram[i] = verify steps that accepted i drafts; bounded length.
Histogram = Annotated[list[Counter], msgspec.Meta(max_length=4096)]
