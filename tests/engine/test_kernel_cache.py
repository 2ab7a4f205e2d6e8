"""The compiled kernels' cache is keyed by every module their code comes from, so that a change to a
helper (in `exact`) compiles anew instead of loading kernels that then fail their bit check."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

from whitney.local.engine import exact, kernels, products


def directory_with_changed(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Path:
    real = inspect.getsource

    def edited(obj: object) -> str:
        text = real(obj)
        return text + "\n# edited\n" if obj is module else text

    with monkeypatch.context() as patch:
        patch.setattr(inspect, "getsource", edited)
        return kernels.compiled_directory()


def test_a_change_to_a_kernel_helper_moves_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    unchanged = kernels.compiled_directory()
    assert kernels.compiled_directory() == unchanged
    assert unchanged.parent == tmp_path / "whitney-flows" / "inductor"
    assert directory_with_changed(exact, monkeypatch) != unchanged
    assert directory_with_changed(kernels, monkeypatch) != unchanged
    assert directory_with_changed(products, monkeypatch) != unchanged
    assert directory_with_changed(pytest, monkeypatch) == unchanged
