"""The fields of a spec a rehearsal does not emulate, found by walking the spec against the fields
it does, so that nothing is dropped without a word: a platform lists what it emulates once, and
everything else a spec holds is named at the start of the run.

A schema is a dict of field name -> ALL (the whole value is emulated), a nested schema, or a list
holding one schema (for each item of a list). Every leaf no schema names is reported as
`path=value`, the same path and value in several list items once, with their indices:
`workerPoolSpecs[0,1].machineSpec.machineType=a2-highgpu-1g`.
"""

from __future__ import annotations

import json

ALL = True  # the field and everything under it is emulated
_SHOWN = 60  # characters of a value shown


def not_emulated(document, schema) -> list[str]:
    """`path=value` for every field of `document` that `schema` does not name, in document order."""
    found: dict[tuple, list] = {}
    _walk(document, schema, (), found)
    lines = []
    for (path, value), indices in found.items():
        text = "".join(f"[{','.join(map(str, sorted(set(indices[i]))))}]" if part == "[]" else
                       (part if i == 0 else f".{part}") for i, part in enumerate(path))
        lines.append(f"{text}={value}")
    return lines


NOTHING: dict = {}  # no field of a value is emulated: each of its leaves is named


def _walk(value, schema, path: tuple, found: dict, indices: tuple = ()) -> None:
    if schema is ALL:
        return
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        item_schema = schema[0] if isinstance(schema, list) else NOTHING
        for index, item in enumerate(value):
            _walk(item, item_schema, (*path, "[]"), found, (*indices, index))
        return
    if isinstance(value, dict) and isinstance(schema, dict):
        for key, item in value.items():
            if item in (None, "", [], {}):
                continue  # an empty field asks for nothing
            _walk(item, schema.get(key, NOTHING) if key in schema else NOTHING, (*path, key), found, indices)
        return
    _report(path, value, found, indices)


def _report(path: tuple, value, found: dict, indices: tuple) -> None:
    shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN - 3] + "..."
    entry = found.setdefault((path, shown), {})
    list_positions = [i for i, part in enumerate(path) if part == "[]"]
    for position, index in zip(list_positions, indices):
        entry.setdefault(position, []).append(index)
