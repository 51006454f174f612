"""Free paragraphs after a numpydoc field list become a "Notes" section.

fastattn's docstrings go on in prose after their Parameters or Attributes list (what
runs where, NaN rules, threads). numpydoc would read each line of that prose as one more
parameter name; this moves the prose (up to the next section) into the Notes section,
which numpydoc renders as text. A docstring that already uses a Notes header is left as
it is. Runs before numpydoc (a lower priority number on autodoc-process-docstring).
"""

from __future__ import annotations

import re

FIELD_SECTIONS = {"Parameters", "Other Parameters", "Attributes"}
# "name", "name : type", "a, b : type", "*args"; anything else unindented there is prose.
FIELD = re.compile(r"^\*{0,2}\w+(\s*,\s*\*{0,2}\w+)*\s*(:.*)?$")
# Their Returns entries are free text too: there, prose is what follows a blank line.
RETURN_SECTIONS = {"Returns", "Yields"}


def _is_header(lines: list[str], i: int) -> bool:
    return (
        i + 1 < len(lines)
        and lines[i].strip() != ""
        and not lines[i].startswith(" ")
        and re.fullmatch(r"-{3,}", lines[i + 1].strip()) is not None
        and len(lines[i + 1].strip()) == len(lines[i].strip())
    )


def move_prose_to_notes(lines: list[str]) -> None:
    headers = [i for i in range(len(lines)) if _is_header(lines, i)]
    if any(lines[i].strip() == "Notes" for i in headers):
        return
    prose: list[str] = []
    keep: list[str] = []
    for n, start in enumerate(headers):
        end = headers[n + 1] if n + 1 < len(headers) else len(lines)
        if not keep:
            keep.extend(lines[:start])
        section = lines[start:end]
        cut = len(section)
        title = lines[start].strip()
        if title in FIELD_SECTIONS | RETURN_SECTIONS:
            for j in range(3, len(section)):
                line = section[j]
                after_blank = section[j - 1].strip() == ""
                field = title in FIELD_SECTIONS and FIELD.match(line)
                if line and not line.startswith(" ") and after_blank and not field:
                    cut = j
                    break
        keep.extend(section[:cut])
        prose.extend(section[cut:])
    if not prose:
        return
    while prose and prose[-1].strip() == "":
        prose.pop()
    examples = next(
        (i for i, line in enumerate(keep) if line.strip() == "Examples" and _is_header(keep, i)),
        len(keep),
    )
    notes = ["Notes", "-----", *prose, ""]
    if examples == len(keep) and keep and keep[-1].strip() != "":
        notes.insert(0, "")
    lines[:] = keep[:examples] + notes + keep[examples:]


def _process(app, what, name, obj, options, lines) -> None:
    move_prose_to_notes(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
