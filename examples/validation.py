"""The README's WAF validation table from Python: ftlab's greedy GC under uniform random writes
against published greedy simulations and Desnoyers' large-block limit.

    python examples/validation.py      (after `pip install .`)
"""

from concurrent.futures import ThreadPoolExecutor

import ftlab

ROWS = [(0.07, 7.62), (0.28, 2.46)]  # rho, independent greedy simulations


def waf(rho: float) -> float:
    return ftlab.simulate({"preset": "validation-uniform", "capacity.over_provisioning": rho})["waf"]


# simulate() releases the GIL: the two points run at once on two cores.
with ThreadPoolExecutor() as pool:
    measured = list(pool.map(waf, [rho for rho, _ in ROWS]))

print("rho   ftlab WAF  greedy simulations  Desnoyers' limit")
for (rho, reference), w in zip(ROWS, measured):
    print(f"{rho:<5} {w:9.3f}  {reference:18}  {ftlab.desnoyers_greedy_waf(rho):16.2f}")
