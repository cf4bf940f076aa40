"""Where `make test`'s time goes: `python -m tests.suite_times [build/test-times.xml]` sums the per-test times the
last `make test` wrote (its --junitxml) by file, slowest first, so the files worth making cheaper are known."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

DEFAULT_REPORT = Path("build/test-times.xml")


def times_by_file(report: Path) -> Counter[str]:
    """Seconds of setup, call and teardown of every test in `report`, summed by test file."""
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split("::")[0]
        path = module.replace(".", "/")
        for suffix in range(path.count("/") + 1):  # a class's tests: the file is the dotted name without the class
            candidate = path.rsplit("/", suffix)[0] + ".py"
            if Path(candidate).is_file():
                path = candidate[:-3]
                break
        totals[path + ".py"] += float(case.get("time", 0))
    return totals


def main() -> None:
    report = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_REPORT
    totals = times_by_file(report)
    overall = sum(totals.values())
    print(f"{overall / 60:.1f} test-minutes in {len(totals)} files (the wall time is less: the tests run in parallel)")
    for path, seconds in totals.most_common(40):
        print(f"{seconds:8.1f} s  {100 * seconds / overall:5.1f}%  {path}")


if __name__ == "__main__":
    main()
