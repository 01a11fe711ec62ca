"""``python -m specmeter.streams.demo``: runs ``cli/demo.py``."""

from ..cli.demo import main

main()
