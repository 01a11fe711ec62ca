"""``specmeter.streams.synthetic``: the synthetic fleet under the name it has always had.

The fleet lives with what else feeds a worker, ``fleet/synthetic.py``; this module only
keeps the import path that benchmarks, tests and users' scripts name.
"""

from .fleet.synthetic import ALGORITHMS, FleetEvent, FleetSpec, synthetic_fleet

__all__ = ["FleetSpec", "FleetEvent", "synthetic_fleet", "ALGORITHMS"]
