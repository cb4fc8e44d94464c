"""Shared fixtures: the `ftlab` binary the Python package is compared with, and folders."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


def ftlab_binary() -> str:
    """$FTLAB_BIN, else the newest of target/release/ftlab and target/debug/ftlab."""
    given = os.environ.get("FTLAB_BIN")
    if given:
        return given
    built = [p for p in (ROOT / "target/release/ftlab", ROOT / "target/debug/ftlab") if p.exists()]
    if not built:
        pytest.fail("no ftlab binary: cargo build --release, or set FTLAB_BIN")
    return str(max(built, key=lambda p: p.stat().st_mtime))


@pytest.fixture(scope="session")
def ftlab_bin() -> str:
    return ftlab_binary()


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


@pytest.fixture(scope="session")
def traces() -> pathlib.Path:
    return SHARED / "traces"


def run_cli(*args: str, cwd=ROOT, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([ftlab_binary(), *args], cwd=cwd, capture_output=True, text=True, check=check)
