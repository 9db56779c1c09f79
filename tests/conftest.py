"""Shared pytest fixtures: the repository layout and the book configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def book_config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


@pytest.fixture(scope="session")
def repository_url(book_config: dict) -> str:
    return book_config["repository"]["url"].rstrip("/")
