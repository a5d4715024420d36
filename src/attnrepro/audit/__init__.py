"""`attnrepro audit package.module:function`: the chapter's battery against your attention.

load.py      resolve and validate the callable; identity; time limit per check
cases.py     the parity grid and the tolerance rule
reference.py the float64 reference, and the chapter's bugs as hypotheses
checks.py    parity, invariants, numerics, scale
cost.py      latency and peak memory against SDPA
diagnose.py  failed checks -> the likely cause in the chapter's terms
render.py    the terminal page and the JSON record
cli.py       the subcommand
"""
