"""The cache of diagnoses: asking the same question of the same large trace again (the HTML
after the terminal, `check`, `diff`) reads the diagnosis back, the same to the byte; another
option, another spec file's content, a changed trace or another wallfinder asks anew; a
damaged entry is analysed again and replaced; without `cache` nothing is kept."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from test_trace_cache import Calls, a_trace, cache  # noqa: F401  (the fixture)

import wallfinder.api as api
from wallfinder import Options, Thresholds, analyze
from wallfinder.cli import main
from wallfinder.trace import _cache

Diagnoses = Calls
"""The diagnoses `analyze` computes (reads of the cache are not)."""


@pytest.fixture
def diagnoses(monkeypatch: pytest.MonkeyPatch) -> Diagnoses:
    return Calls(monkeypatch, api, "_diagnose")


def results(parsed: Path) -> list[Path]:
    folder = parsed.parent / "results"
    return sorted(folder.glob("*.result")) if folder.exists() else []


def test_the_same_question_is_answered_from_the_cache(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    diagnoses: Diagnoses,
) -> None:
    path = a_trace(tmp_path)
    fresh = analyze(path).to_json()
    assert diagnoses.count == 1
    assert not results(cache)  # no cache asked for: none kept
    assert analyze(path, Options(cache=True)).to_json() == fresh
    assert diagnoses.count == 2
    assert len(results(cache)) == 1
    assert analyze(path, Options(cache=True)).to_json() == fresh
    assert diagnoses.count == 2


def test_another_option_or_spec_content_asks_anew(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    diagnoses: Diagnoses,
) -> None:
    path = a_trace(tmp_path)
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "Mine"\nmem_bandwidth = 1e12\n[peak_flops]\nfp32 = 10e12\n')
    asks = [
        Options(cache=True),
        Options(cache=True, device="A100"),
        Options(cache=True, thresholds=Thresholds(near_peak=0.5)),
        Options(cache=True, what_if="data"),
        Options(cache=True, spec_file=spec),
    ]
    answers = [analyze(path, o).to_json() for o in asks]
    assert diagnoses.count == len(asks)
    assert len(results(cache)) == len(asks)
    assert answers[1] != answers[0]  # a named device: peaks, MFU
    for o, a in zip(asks, answers, strict=True):
        assert analyze(path, o).to_json() == a
    assert diagnoses.count == len(asks)
    spec.write_text('name = "Mine"\nmem_bandwidth = 2e12\n[peak_flops]\nfp32 = 20e12\n')
    changed = analyze(path, asks[-1])
    assert diagnoses.count == len(asks) + 1
    assert changed.to_json() == analyze(path, dataclasses.replace(asks[-1], cache=False)).to_json()


def test_a_changed_trace_or_another_wallfinder_asks_anew(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    diagnoses: Diagnoses,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = a_trace(tmp_path)
    analyze(path, Options(cache=True))
    a_trace(tmp_path, "other.json").replace(path)  # the same text, a new mtime
    with path.open("a") as f:
        f.write("\n")
    analyze(path, Options(cache=True))
    assert diagnoses.count == 2
    monkeypatch.setattr(_cache, "analysis_id", lambda: "another wallfinder")
    analyze(path, Options(cache=True))
    assert diagnoses.count == 3


def test_a_damaged_entry_is_analysed_again_and_replaced(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    diagnoses: Diagnoses,
) -> None:
    path = a_trace(tmp_path)
    fresh = analyze(path, Options(cache=True)).to_json()
    (entry,) = results(cache)
    entry.write_bytes(entry.read_bytes()[:100])
    assert analyze(path, Options(cache=True)).to_json() == fresh
    assert diagnoses.count == 2
    assert analyze(path, Options(cache=True)).to_json() == fresh
    assert diagnoses.count == 2  # the rewritten entry is read


def test_small_traces_keep_no_diagnosis(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cache, "FROM_BYTES", 1 << 30)
    analyze(a_trace(tmp_path), Options(cache=True))
    assert not results(cache)


def test_the_cli_reads_the_diagnosis_back_unless_told_not_to(
    tmp_path: Path,
    cache: Path,  # noqa: F811
    diagnoses: Diagnoses,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(a_trace(tmp_path))
    assert main(["analyze", path, "--format", "json"]) == 0
    first = capsys.readouterr().out
    assert main(["analyze", path, "--format", "json"]) == 0
    assert capsys.readouterr().out == first
    assert diagnoses.count == 1
    assert main(["analyze", path, "--format", "json", "--no-cache"]) == 0
    assert capsys.readouterr().out == first
    assert diagnoses.count == 2
    assert main(["check", path, "--max-idle", "1.0"]) == 0
    assert diagnoses.count == 2


def test_a_files_key_is_read_once_per_state_of_the_file(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_bytes(b"a" * 100)
    opened: list[Path] = []
    real_open = Path.open

    def counting(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self)
        return real_open(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "open", counting)
        first = _cache.file_key(f)
        assert _cache.file_key(f) == first
        assert opened == [f]
        # Rewritten (another content, another mtime): read again, another key.
        f.write_bytes(b"b" * 100)
        os.utime(f, ns=(10**18, 10**18))
        opened.clear()
        assert _cache.file_key(f) != first
        assert opened == [f]
