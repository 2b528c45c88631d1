"""The GPU test run's summary for benchmarks/results/gpu_tests.json, from pytest's log:

    python benchmarks/gpu_tests_summary.py tests.log SECONDS EXIT_STATUS > gpu_tests.json

commit (SHUFFLEMOE_COMMIT on the device, whose tree has no .git), device, versions, date, the
passed / failed / skipped / error counts of pytest's last line, the failed test ids, duration."""

from __future__ import annotations

import json
import re
import sys

from shufflemoe.bench.report import metadata


def summarize(log: str, seconds: int, status: int) -> dict:
    counts = {}
    tail = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    if tail:
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", tail[-1]):
            counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", log, flags=re.M)))
    return dict(meta=metadata(), exit_status=status, duration_s=seconds,
                passed=counts.get("passed", 0), failed=counts.get("failed", 0),
                errors=counts.get("error", 0), skipped=counts.get("skipped", 0),
                failed_tests=failed, summary=tail[-1].strip("= ") if tail else "no summary line")


if __name__ == "__main__":
    path, seconds, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(summarize(open(path).read(), seconds, status), indent=1))
