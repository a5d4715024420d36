"""`attnrepro audit package.module:function`: the chapter's battery against your attention.

cases.py              the parity grid and the tolerance rule
float64_reference.py  the float64 reference, and the chapter's bugs as hypotheses
checks.py             parity, invariants, numerics, scale
determinism.py        two identical calls agree; dropout at dropout_p's rate, rescaled
cost.py               latency and peak memory against SDPA
diagnose.py           failed checks -> the likely cause in the chapter's terms
render.py             the terminal page, the report section and the JSON record
battery.py            every check in order, each under a time limit

The callable is loaded by attnrepro.model.attention_impl; the subcommand is attnrepro.commands.audit.
Imports model, measure and the top modules.
"""
