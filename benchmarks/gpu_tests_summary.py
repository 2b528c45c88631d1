"""The GPU test run's summary for benchmarks/results/gpu_tests.json, from pytest's log:

    python benchmarks/gpu_tests_summary.py tests.log SECONDS EXIT_STATUS > gpu_tests.json

commit (SHUFFLEMOE_COMMIT on the device, whose tree has no .git), device, versions, date, the
passed / failed / skipped / error counts of pytest's last line, the failed test ids, duration.
A run cut off by its timeout has no last line: the counts then come from the verbose per-test
lines, and ``unfinished`` names the tests that started and never reported."""

from __future__ import annotations

import json
import re
import sys

from shufflemoe.bench.report import metadata


# pytest -v -n N prints "tests/x.py::t " when a test starts, "[gwK] [ P%] PASSED tests/x.py::t"
# when it is done
_RESULT = re.compile(r"^\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (.+?)\s*$")


def summarize(log: str, seconds: int, status: int, meta: dict | None = None) -> dict:
    counts, unfinished = {}, []
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", log, flags=re.M)))
    tail = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    if tail:
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", tail[-1]):
            counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    else:
        started, done = set(), {}
        for line in log.splitlines():
            m = _RESULT.match(line)
            if m:
                done[m.group(2)] = m.group(1)
            elif line.startswith("tests/") and "::" in line:
                started.add(line.strip())
        for outcome in done.values():
            key = {"ERROR": "error", "XFAIL": "xfailed", "XPASS": "xpassed"}.get(outcome,
                                                                              outcome.lower())
            counts[key] = counts.get(key, 0) + 1
        unfinished = sorted(started - set(done))
        failed = sorted(t for t, outcome in done.items() if outcome in ("FAILED", "ERROR"))
    return dict(meta=meta or metadata(), exit_status=status, duration_s=seconds,
                passed=counts.get("passed", 0), failed=counts.get("failed", 0),
                errors=counts.get("error", 0), skipped=counts.get("skipped", 0),
                failed_tests=failed, unfinished=unfinished,
                summary=tail[-1].strip("= ") if tail else "no summary line: counted per test")


if __name__ == "__main__":
    path, seconds, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(summarize(open(path).read(), seconds, status), indent=1))
