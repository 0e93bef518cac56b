"""koordnode's Prometheus metrics: what koordnode did and what it sees.

- :mod:`koordnode.metrics.recorder`: the :class:`~koordnode.metrics.recorder.Metrics` every
  component records into, and the process's default instance ``METRICS``.
- :mod:`koordnode.metrics.followers`: values read from their owners at each scrape (hook
  failures, the proxy's counters, per-pod CPU pressure).
- :mod:`koordnode.metrics.types`: counters, gauges and histograms with labels, and the registry.
- :mod:`koordnode.metrics.process`: ``process_*`` and ``python_info``.
- :mod:`koordnode.metrics.exposition`: the Prometheus text format (0.0.4).
- :mod:`koordnode.metrics.server`: the HTTP endpoint at ``/metrics``.

koordnode writes the exposition itself: a client library would cost the daemon more resident
memory than all of this (it also pulls in ssl and http.server).
"""
