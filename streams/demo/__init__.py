"""``python -m specmeter.streams.demo``: the README's main job (``deploy/dev demo``).

The demo is a command like the others, ``cli/demo.py``; this package only keeps the
name it has always run under.
"""
