"""The notebooks in examples/, executed top to bottom against the installed package, as a
researcher would run them: a cell that raises (their own checks included) fails the test, so
the examples never rot."""

import json

import nbclient
import nbformat
import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"sweep", "trace", "validation"}, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_and_its_checks_hold(path):
    book = nbformat.read(path, as_version=4)
    # Stored without outputs: what is committed is the source, not one run's figures.
    for cell in book.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: a cell stored with outputs"
    client = nbclient.NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    # Each figure drawn reached the notebook as an image.
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert path.stem == "validation" or images, f"{path.name}: no figure in the outputs: {json.dumps(outputs)[:500]}"
