"""dormant.metrics: counted on the path where a thing happens, published as EMF by a collecting handler,
free when nothing collects; every name the code counts is one of ``METRICS``."""

from __future__ import annotations

import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dormant import adk, metrics
from dormant.app import App
from dormant.stores.sqlite import sqlite_store
from dormant.testing import MockAdapter

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "layers" / "dormant" / "python" / "dormant"
COUNTED = re.compile(r"""metrics\.count\(\s*"([a-z_]+)"|"(model_(?:input|output)_tokens|model_latency_ms)\"""")


class Notes(BaseModel):
    shared: str = ""
    a: int = 0


@pytest.fixture(autouse=True)
def on_lambda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handlers collect only on Lambda (``AWS_LAMBDA_FUNCTION_NAME`` set, as Lambda sets it)."""
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "dormant-test")


def test_off_lambda_a_collection_collects_nothing(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME")
    with metrics.collecting("run") as collected:
        metrics.count("turns", agent="a")
    assert collected == [] and capsys.readouterr().out == ""


def emf(text: str) -> list[dict[str, Any]]:
    """The EMF records among printed lines."""
    records = []
    for line in text.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            records.append(json.loads(line))
    return records


def values(records: list[dict[str, Any]], name: str, **dims: str) -> list[float]:
    """Every value of ``name`` in records whose dimensions are exactly ``dims`` (plus service)."""
    found: list[float] = []
    for record in records:
        (directive,) = record["_aws"]["CloudWatchMetrics"]
        (dim_set,) = directive["Dimensions"]
        if directive["Namespace"] != metrics.NAMESPACE or set(dim_set) != {"service", *dims}:
            continue
        if any(record[k] != v for k, v in dims.items()) or name not in record:
            continue
        value = record[name]
        found += value if isinstance(value, list) else [value]
    return found


def test_every_counted_name_is_a_metric_with_its_unit() -> None:
    counted = set()
    for path in CODE.rglob("*.py"):
        for match in COUNTED.finditer(path.read_text(encoding="utf-8")):
            counted.add(match.group(1) or match.group(2))
    assert counted == set(metrics.METRICS), counted ^ set(metrics.METRICS)
    assert {m.unit for m in metrics.METRICS.values()} == {"Count", "Milliseconds"}


def test_nothing_is_collected_or_printed_without_a_collection(capsys: Any) -> None:
    metrics.count("turns", agent="a")
    metrics.model_call("a", 1, 2, 3.0)
    assert capsys.readouterr().out == ""


def test_a_collection_prints_emf_by_function_and_agent_and_never_an_id(capsys: Any) -> None:
    with metrics.collecting("run") as collected:
        metrics.count("turns", agent="helper")
        metrics.count("conflicts", agent="helper")  # not by agent: the agent is dropped
        metrics.model_call("helper", 10, 4, 12.5)
        seen_elsewhere: list[int] = []
        thread = threading.Thread(target=lambda: (metrics.count("turns"), seen_elsewhere.append(len(collected))))
        thread.start()
        thread.join()
    records = emf(capsys.readouterr().out)
    assert values(records, "turns", function="run", agent="helper") == [1.0]
    assert values(records, "conflicts", function="run") == [1.0]
    assert values(records, "model_input_tokens", function="run", agent="helper") == [10.0]
    assert values(records, "model_output_tokens", function="run", agent="helper") == [4.0]
    assert values(records, "model_latency_ms", function="run", agent="helper") == [12.5]
    assert seen_elsewhere == [5]  # another thread's count (a server's turn thread) is not this invocation's
    metrics.count("turns")  # closed: nothing more
    assert capsys.readouterr().out == ""


def test_published_even_when_the_handler_raises(capsys: Any) -> None:
    with pytest.raises(RuntimeError), metrics.collecting("resume"):
        metrics.count("failures")
        raise RuntimeError("boom")
    assert values(emf(capsys.readouterr().out), "failures", function="resume") == [1.0]


def handle(path: Path, name: str) -> App:
    return adk(name=name, schema={"session": Notes}, store=sqlite_store(path), adapters={"openai": MockAdapter()})


def test_the_write_path_counts_conflicts_merges_and_forks(tmp_path: Path, capsys: Any) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    mine, other = handle(tmp_path / "m.db", name), handle(tmp_path / "m.db", name)
    mine.sessions.create("s-1")

    def racing(key: str) -> Any:
        def change(session: Any) -> None:
            theirs = other.sessions.require("s-1")
            setattr(theirs.state, key, "theirs" if key == "shared" else 2)
            other.sessions.commit(theirs)
            session.input.message("mine")
            session.state.shared = f"mine {key}"

        return change

    with metrics.collecting("tools"):
        assert mine.sessions.write("s-1", racing("a"), on_conflict="merge").status == "merged"
        assert mine.sessions.write("s-1", racing("shared"), on_conflict="merge").status == "forked"
    records = emf(capsys.readouterr().out)
    assert values(records, "conflicts", function="tools") == [1.0, 1.0]
    assert values(records, "merges", function="tools") == [1.0]
    assert values(records, "forks", function="tools") == [1.0]


def test_a_snapshot_that_cannot_be_stored_is_counted(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    app = adk(
        name="snap",
        schema={"session": Notes},
        store=sqlite_store(tmp_path / "s.db"),
        adapters={"openai": MockAdapter()},
        snapshot_every=2,
    )
    session = app.sessions.create("s-1")

    def refuse(*args: Any, **kwargs: Any) -> bool:
        raise OSError("the store is down")

    monkeypatch.setattr(type(app.store), "save_snapshot", refuse)
    with metrics.collecting("commit"):
        for text in ("one", "two", "three"):
            session.input.message(text)
            app.sessions.commit(session)
    assert values(emf(capsys.readouterr().out), "snapshot_write_failures", function="commit")
