"""Benchmarks: suites of cases timed on a GPU against their ceilings and peers (see suites/)."""
