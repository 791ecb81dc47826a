"""Residency as the management routes show it (issue 46): each model's memory (measured at its last load, else the
header estimate), its counters, and the residency totals in /v1/status."""
from __future__ import annotations

from typing import Any

from mindie_service.catalog.catalog import CatalogEntry
from mindie_service.catalog.residency import Residency
def memory_view(e: CatalogEntry, estimate: int) -> dict[str, Any]:
    """What residency knows of ``e``'s memory: measured at its last load (null before one), the header estimate, and
    which of the two the fit check uses; its counters."""
    c = e.counters
    return {"measured": e.memory.as_json() if e.memory is not None else None, "estimate_bytes": estimate,
            "fit_check_uses": "measured" if Residency.measured(e) is not None else "estimate",
            "loads": c.loads, "load_failures": c.load_failures, "load_seconds_total": round(c.load_seconds_sum, 3),
            "evictions": dict(c.evictions), "sleeps": c.sleeps, "sleep_level": e.sleep_level,
            "keep_alive_s": None if e.keep_alive_s is None or e.keep_alive_s == float("inf") else e.keep_alive_s,
            "keep_alive_forever": e.keep_alive_s == float("inf")}


def residency_json(res: Residency) -> dict[str, Any]:
    """/v1/status' ``residency``: the limits, what the resident models hold, and each catalog model's state, last
    use and memory (measured, or the estimate the fit check would use)."""
    cat, pol = res.catalog, res.policy
    resident = [e for e in cat.entries.values() if res.resident(e)]
    return {
        "maxLoadedModels": pol.max_loaded, "modelMemoryBudget": pol.budget, "budget_bytes": res.budget,
        "loaded": len(resident), "held_bytes": sum(res.held_bytes(e) for e in resident),
        "beyond_estimate_bytes": res.beyond_estimate,  # added to an unmeasured model's header estimate
        "businessModelLoads": pol.business_loads,
        "models": [{"id": e.id, "state": e.state, "last_used": e.last_used, "active": e.active,
                    "memory": e.memory.as_json() if e.memory is not None else None,
                    "held_bytes": res.held_bytes(e) if res.resident(e) else 0} for e in cat.entries.values()],
    }
