"""One /metrics for the workers of `pgqueue worker --processes N`: each child's own metrics,
read from its private port on 127.0.0.1 at scrape time and summed by name and labels, beside
the database's gauges, read once (pgqueue/metrics.py's DatabaseCollector).

Owns: the ports of the children running, the last samples read of each, and the counters and
histograms of the children that have ended.

Invariants: a child's counters and histograms outlive it: when it ends, the last values read
of it are kept and added to every later sum, so a restart never takes a sum back (which
Prometheus would read as a reset) and never counts a child twice. What a child counted after
the last scrape before it ended is lost: a killed process cannot hand it over. Gauges are the
sum of the children running now.

Fails: a child that cannot be read (starting, stopping) counts with the last values read of
it, or not at all. Needs the `metrics` extra, as pgqueue/metrics.py does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from urllib.error import URLError
from urllib.request import urlopen

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

READ_TIMEOUT_SECONDS = 2.0  # a child that does not answer in this long counts as unreadable
Key = tuple[str, str, tuple[tuple[str, str], ...]]  # family, sample name, labels


class ChildrenCollector(Collector):
    """The sum of the children's metrics. The supervisor says which child listens where
    (`watch`) and which has ended (`retire`); Prometheus's scrape reads them (`collect`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a scrape and a retire never interleave
        self._ports: dict[int, int] = {}
        self._last: dict[int, dict[Key, float]] = {}
        self._kept: dict[Key, float] = {}
        self._kinds: dict[str, tuple[str, str]] = {}  # family: (type, help)

    def watch(self, index: int, port: int) -> None:
        with self._lock:
            self._ports[index] = port

    def retire(self, index: int) -> None:
        """Keep what child `index` counted, as last read: it has ended."""
        with self._lock:
            self._ports.pop(index, None)
            for key, value in self._last.pop(index, {}).items():
                if self._kinds[key[0]][0] != "gauge":
                    self._kept[key] = self._kept.get(key, 0.0) + value

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            for index, port in self._ports.items():
                read = self._read(port)
                if read is not None:
                    self._last[index] = read
            sums = dict(self._kept)
            for samples in self._last.values():
                for key, value in samples.items():
                    sums[key] = sums.get(key, 0.0) + value
            kinds = dict(self._kinds)
        yield from _families(sums, kinds)

    def _read(self, port: int) -> dict[Key, float] | None:
        try:
            with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=READ_TIMEOUT_SECONDS) as r:
                text = r.read().decode()
        except (URLError, OSError):
            return None
        found: dict[Key, float] = {}
        for family in text_string_to_metric_families(text):
            self._kinds[family.name] = (family.type, family.documentation)
            for sample in family.samples:
                if not sample.name.endswith("_created"):  # a time, not a count: never summed
                    labels = tuple(sorted(sample.labels.items()))
                    found[(family.name, sample.name, labels)] = sample.value
        return found


def _families(sums: dict[Key, float], kinds: dict[str, tuple[str, str]]) -> Iterator[Metric]:
    """The summed samples as families, each sample in the order a child wrote it (a
    histogram's buckets stay in order)."""
    built: dict[str, Metric] = {}
    for (name, sample, labels), value in sums.items():
        family = built.get(name)
        if family is None:
            kind, documentation = kinds[name]
            family = built[name] = Metric(name, documentation, kind)
        family.add_sample(sample, dict(labels), value)
    yield from built.values()
