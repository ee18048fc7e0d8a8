"""Estimate memory before allocating it: a run that cannot fit is refused at once, with the
largest size that would fit, instead of being killed by the operating system hours later."""

from __future__ import annotations

import os

from ..errors import AssumptionError

__all__ = ["available_bytes", "require_memory"]


def available_bytes() -> int:
    """Memory the process can still use: MemAvailable of /proc/meminfo, else the physical memory."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def require_memory(needed: int, option: str, what: str, largest_fitting: int, fraction: float = 0.8) -> None:
    """Refuse (AssumptionError naming ``option``) when ``needed`` bytes exceed ``fraction`` of the
    available memory; ``largest_fitting`` is the largest value of the option that would fit."""
    limit = int(available_bytes() * fraction)
    if needed > limit:
        raise AssumptionError(option, f"a size whose {what} fits in memory (at most {largest_fitting} here)",
                              f"a run needing about {needed / 2 ** 30:.3g} GiB, with {limit / 2 ** 30:.3g} GiB "
                              "available",
                              f"lower `{option}` to {largest_fitting} or less")
