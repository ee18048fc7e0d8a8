"""Start-up time of the symbolic commands, side by side with the bare interpreter.

Runs each command as a fresh process several times and prints the median wall time, the
time above a bare ``python -c pass`` (what lipbound itself costs), and how many modules the
command loaded, with a check that none of the numeric layer, cvxpy or scipy is among them.

Run: ``python bench/bench_startup.py [--repeat 5]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("lipbound.numeric", "lipbound.measures", "cvxpy", "scipy")

COMMANDS = {
    "python -c pass": "pass",
    "import lipbound.cli": "import lipbound.cli",
    "lipbound list": "from lipbound.cli import main; main(['list'])",
    "lipbound derive dot-product": "from lipbound.cli import main; main(['derive', 'dot-product'])",
    "lipbound derive cosine --proof": "from lipbound.cli import main; main(['derive', 'cosine', '--proof'])",
}

_REPORT = ("\nimport sys; heavy = sorted(m for m in sys.modules if m.startswith({heavy!r})); "
           "sys.stderr.write('MODULES %d HEAVY %s\\n' % (len(sys.modules), ','.join(heavy) or '-'))")


def measure(code: str, repeat: int) -> tuple[float, int, str]:
    times, modules, heavy = [], 0, "-"
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code + _REPORT.format(heavy=HEAVY)],
                              capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - started)
        line = next(l for l in done.stderr.splitlines() if l.startswith("MODULES"))
        _, modules, _, heavy = line.split()
    return statistics.median(times), int(modules), heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command (median reported)")
    args = parser.parse_args()
    base = None
    print(f"{'command':34s} {'median s':>9s} {'above python':>13s} {'modules':>8s}  numeric/cvxpy/scipy loaded")
    for name, code in COMMANDS.items():
        seconds, modules, heavy = measure(code, args.repeat)
        base = seconds if base is None else base
        print(f"{name:34s} {seconds:9.3f} {seconds - base:13.3f} {modules:8d}  {heavy}")


if __name__ == "__main__":
    main()
