"""``python -m specmeter.streams.cli ...``: the ``specmeter`` command line."""

from . import main

main(prog_name="specmeter")
