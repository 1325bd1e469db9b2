"""Reading a daemon's /metrics with prometheus-client's own text parser."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from tests.serve_helpers import http_get

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (sample name, its labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The value of the one sample `name{labels}` (KeyError, listing what there is, if
    it is absent: a series missing is what these tests look for)."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        known = sorted(sorted(k[1]) for k in samples if k[0] == name)
        raise KeyError(f"no sample {name}{labels}; those of that name: {known}")
    return samples[key]


def names(samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {name for name, _ in samples}
