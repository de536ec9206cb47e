"""Fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The bundled corpus, prepared once for every training test."""
    from fp4quant.data import prepare

    out = tmp_path_factory.mktemp("tokens")
    prepare(out)
    return str(out)
