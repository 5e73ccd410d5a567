"""Normalise and check lesson notebooks.

    python scripts/nbtools.py tidy FILES    # rewrite each notebook in normal form
    python scripts/nbtools.py check FILES   # exit 1 listing every problem found

Normal form: nbformat 4.5, a stable id on every cell, no stray metadata (only `tags`,
`slideshow` and `nbval_ignore_reason` on cells; only `kernelspec` and `language_info.name` on
the notebook), outputs kept, execution counts 1..n over the executed code cells in order.
A file that is not a notebook in shape (a list, a cell that is a string, metadata of the wrong
type) is reported and left alone; the other files are still checked or tidied. Tidy writes
through a temporary file and a rename, so a failed write leaves the notebook as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
import warnings
from pathlib import Path

import nbformat
from nbformat.validator import normalize

from d2l_gpu._fs import write_atomic

# nbval_ignore_reason: why a cell is not compared; d2l_gpu: a Chinese cell's translation record
CELL_METADATA_KEYS = ("tags", "slideshow", "nbval_ignore_reason", "d2l_gpu")
NOTEBOOK_METADATA_KEYS = ("kernelspec", "language_info", "d2l_gpu")  # d2l_gpu: the execution record
# every notebook names the same kernel, whichever Jupyter executed it last
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}
_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class NotebookError(ValueError):
    """A file that tidy must leave alone: unreadable, not a notebook in shape, or unwritable."""


_NOTEBOOK_SHAPE = {"metadata": dict, "metadata.language_info": dict, "cells": list}
_CELL_SHAPE = {  # key (dotted: inside objects; []: each item of a list) -> JSON type
    "cell_type": str,
    "id": str,
    "metadata": dict,
    "metadata.slideshow": dict,
    "metadata.slideshow.slide_type": str,
    "metadata.tags": list,
    "metadata.tags[]": str,
    "source": (str, list),
    "source[]": str,
    "outputs": list,
    "outputs[]": dict,
}
_ABSENT = object()
_JSON_TYPES = {bool: "a boolean", dict: "an object", list: "a list", str: "a string"}


def _json_type(value) -> str:
    """The JSON name of `value`'s type, with its article, for messages."""
    kind = next((k for k in _JSON_TYPES if isinstance(value, k)), None)
    return _JSON_TYPES.get(kind, "null" if value is None else "a number")


def _wrong_types(obj: dict, shape: dict, required: tuple[str, ...]) -> list[str]:
    """Each key of `shape` present in `obj` whose value has another JSON type; each key missing."""
    out = [f"no {key!r}" for key in required if key not in obj]
    for key, kinds in shape.items():
        kinds, each = kinds if isinstance(kinds, tuple) else (kinds,), key.endswith("[]")
        value = obj
        for part in key.removesuffix("[]").split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT or each and not isinstance(value, list):
            continue  # absent, or its container's wrong type is reported under its own key
        wrong = [v for v in (value if each else [value]) if not isinstance(v, kinds)]
        if wrong:
            what = f"an item of {key[:-2]}" if each else key
            want = " or ".join(_JSON_TYPES[k] for k in kinds)
            out.append(f"{what} is {_json_type(wrong[0])}, not {want}")
    return out


def shape_problems(nb) -> list[str]:
    """What keeps the JSON `nb` from being a notebook that the other checks can look into."""
    if not isinstance(nb, dict):
        return [f"not a notebook: the file holds {_json_type(nb)}, not a JSON object"]
    out = _wrong_types(nb, _NOTEBOOK_SHAPE, ("cells",))
    for i, cell in enumerate(nb["cells"] if isinstance(nb.get("cells"), list) else []):
        if not isinstance(cell, dict):
            out.append(f"cell {i} is {_json_type(cell)}, not an object")
        else:
            out += [f"cell {i}: {p}" for p in _wrong_types(cell, _CELL_SHAPE, ("cell_type",))]
    return out


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _is_runnable(cell) -> bool:
    """True for a code cell that a kernel would execute (nbclient skips blank ones)."""
    return cell.get("cell_type") == "code" and _source(cell).strip() != ""


def first_line(cell) -> str:
    """The first non-blank source line of a cell (shortened), for messages."""
    lines = _source(cell).strip().splitlines()
    return lines[0][:60] if lines else "<empty>"


def _new_id(index: int, cell, taken: set[str]) -> str:
    """A deterministic id derived from the cell's position, type and source."""
    seed = f"{index}:{cell.get('cell_type')}:{_source(cell)}"
    base = hashlib.sha1(seed.encode()).hexdigest()[:8]
    cell_id, n = base, 0
    while cell_id in taken:
        n += 1
        cell_id = f"{base}-{n}"
    return cell_id


def tidy(nb) -> nbformat.NotebookNode:
    """Return a normalised deep copy of notebook `nb` (a dict or NotebookNode)."""
    nb = copy.deepcopy(dict(nb))
    if nb.get("nbformat", 4) != 4:
        nb = nbformat.convert(nbformat.from_dict(nb), 4)
    nb["nbformat"], nb["nbformat_minor"] = 4, 5

    taken: set[str] = set()
    for i, cell in enumerate(nb["cells"]):
        cell_id = cell.get("id")
        if not isinstance(cell_id, str) or not _ID_RE.match(cell_id) or cell_id in taken:
            cell["id"] = _new_id(i, cell, taken)
        taken.add(cell["id"])
        cell["source"] = _source(cell)
        meta = cell.get("metadata", {})
        cell["metadata"] = {k: meta[k] for k in CELL_METADATA_KEYS if meta.get(k)}
        if cell["cell_type"] == "code":
            cell.setdefault("outputs", [])
            cell.setdefault("execution_count", None)
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)

    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        if cell["execution_count"] is None and not any(
            o.get("output_type") == "execute_result" for o in cell["outputs"]
        ):
            continue
        count += 1
        cell["execution_count"] = count
        for out in cell["outputs"]:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = count

    meta = nb.get("metadata", {})
    nb["metadata"] = {k: meta[k] for k in NOTEBOOK_METADATA_KEYS if k in meta}
    nb["metadata"]["kernelspec"] = dict(KERNELSPEC)
    if "language_info" in nb["metadata"]:
        nb["metadata"]["language_info"] = {"name": nb["metadata"]["language_info"].get("name")}
    _, nb = normalize(nb, 4, 5, strip_invalid_metadata=True)
    return nbformat.from_dict(nb)


def dumps(nb) -> str:
    """Serialise a notebook exactly as `tidy` writes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nbformat.writes(nbformat.from_dict(nb), version=4) + "\n"


def load(path) -> dict:
    """Read a notebook file as plain JSON, without any repair on read."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def problems(nb, text: str | None = None) -> list[str]:
    """Every way notebook `nb` (raw JSON) falls short of the lesson rules."""
    out = shape_problems(nb)
    if out:  # the checks below would look into parts that are not there
        return out
    if (nb.get("nbformat"), nb.get("nbformat_minor")) != (4, 5):
        out.append(f"nbformat is {nb.get('nbformat')}.{nb.get('nbformat_minor')}, not 4.5")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nbformat.validate(copy.deepcopy(nb))
    except Exception as e:  # noqa: BLE001 - any failure means invalid
        out.append(f"invalid nbformat: {str(e).splitlines()[0]}")
    meta = nb.get("metadata", {})
    if not meta.get("kernelspec"):
        out.append("no kernelspec in notebook metadata")
    stray = sorted(set(meta) - set(NOTEBOOK_METADATA_KEYS))
    stray += [f"language_info.{k}" for k in meta.get("language_info", {}) if k != "name"]
    if stray:
        out.append(f"stray notebook metadata: {', '.join(stray)}")

    ids = [c.get("id") for c in nb.get("cells", []) if c.get("id")]
    if len(ids) != len(set(ids)):
        out.append("duplicate cell ids")
    expected = 0
    for i, cell in enumerate(nb.get("cells", [])):
        where = f"cell {i} ({first_line(cell)!r})"
        if not _ID_RE.match(str(cell.get("id", ""))):
            out.append(f"{where}: missing or invalid id")
        cmeta = cell.get("metadata", {})
        if set(cmeta) - set(CELL_METADATA_KEYS):
            out.append(f"{where}: stray metadata {sorted(set(cmeta) - set(CELL_METADATA_KEYS))}")
        if cmeta.get("slideshow", {}).get("slide_type") not in SLIDE_TYPES:
            out.append(f"{where}: no metadata.slideshow.slide_type")
        if cell.get("cell_type") != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"{where}: error output {o.get('ename')}: {o.get('evalue')}")
        count = cell.get("execution_count")
        if count is None:
            if _is_runnable(cell):
                out.append(f"{where}: code cell not executed")
            continue
        expected += 1
        if count != expected:
            out.append(f"{where}: execution count {count}, expected {expected}")

    if text is not None and not out:
        try:
            if dumps(tidy(nb)) != text:
                out.append("would change under tidy (run: python scripts/nbtools.py tidy FILE)")
        except Exception as e:  # noqa: BLE001
            out.append(f"tidy fails: {e}")
    return out


def _read(path) -> tuple[str, object]:
    """The text of notebook file `path` and its JSON, or NotebookError saying why not."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        return text, json.loads(text)
    except (OSError, ValueError) as e:
        raise NotebookError(f"cannot read: {e}") from None
    except RecursionError:
        raise NotebookError("cannot read: nested too deeply to be a notebook") from None


def check_file(path) -> list[str]:
    """Problems of the notebook file at `path`."""
    try:
        return problems(*reversed(_read(path)))
    except NotebookError as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001 - a shape no check foresaw: report it, go on
        return [f"cannot be checked ({type(e).__name__}: {e}); is it a notebook?"]


def tidy_file(path) -> bool:
    """Rewrite `path` in normal form, atomically; return True if it changed, else NotebookError."""
    text, nb = _read(path)
    shape = shape_problems(nb)
    if shape:
        raise NotebookError("; ".join(shape))
    try:
        new = dumps(tidy(nb))
    except Exception as e:  # noqa: BLE001 - a shape no check foresaw
        raise NotebookError(f"cannot be tidied ({type(e).__name__}: {e})") from None
    if new != text:
        try:
            write_atomic(path, new)
        except OSError as e:
            raise NotebookError(f"cannot write it ({e.strerror or e}); it is unchanged") from None
    return new != text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 1 or argv[0] not in ("check", "tidy"):
        print(__doc__)
        return 2
    cmd, files = argv[0], argv[1:]
    bad = 0
    for f in files:
        if cmd == "tidy":
            try:
                print(f"{'tidied' if tidy_file(f) else 'unchanged'}: {f}")
            except NotebookError as e:
                bad += 1
                print(f"not tidied: {f}: {e}")
            continue
        found = check_file(f)
        bad += bool(found)
        for p in found:
            print(f"{f}: {p}")
    if cmd == "check":
        print(f"{len(files) - bad}/{len(files)} notebooks clean")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
