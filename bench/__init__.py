"""koordnode's benchmarks. Run each from the repository root as a module, e.g.
``python3 -m bench.qos_tick``: the root on sys.path makes ``koordnode`` (this checkout) and the
test harness (``tests.support``, ``tests.testbed``, ``tests.faketree``) importable as they are."""
