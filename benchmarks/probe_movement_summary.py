"""Print probe_movement.json's rows as one line each, grouped by op and shape, the default tile
marked and the fastest checked tile named (for the device call's output)."""

import json
import sys

d = json.load(open(sys.argv[1]))
print(d["meta"]["gpu"], d["meta"]["commit"], "copy GB/s", d["meta"]["ceilings"]["copy_gbps"])
best: dict = {}
for r in d["rows"]:
    key = (r["op"], r["T"], r["k"])
    print(f"{r['op']:9s} T={r['T']:5d} k={r['k']} {str(r['tile']):24s} {r['us']:9.2f} us "
          f"{r['pct_copy']:5.1f}% {'default' if r['default'] else ''} {'' if r['ok'] else 'WRONG'}")
    if r["ok"] and (key not in best or r["us"] < best[key]["us"]):
        best[key] = r
for key, r in best.items():
    print("best", key, r["tile"], r["pct_copy"])
