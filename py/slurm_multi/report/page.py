"""The pieces both pages are made of: one self-contained HTML document (its style inline, no script,
no font or picture fetched from anywhere), escaped text, tables, relative links, inline pictures."""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote

from slurm_multi import __version__, shell
from slurm_multi.common import HelperError

AREA = "report"
# Text shown inline (a diagnostics file, a cell): past this it is cut, the file stays linked.
MAX_INLINE_CHARS = 64 * 1024

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto;
       max-width: 1200px; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h3 { font-size: 1em; margin: 1em 0 0.3em; }
table { border-collapse: collapse; margin: 0.4em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f9; border: 1px solid #e2e2e6; padding: 0.5em; overflow-x: auto;
      font-size: 0.8em; max-height: 30em; }
code { font-size: 0.9em; }
.verdict { display: inline-block; font-weight: bold; font-size: 1.2em; padding: 0.15em 0.7em;
           border-radius: 0.3em; color: white; margin: 0.3em 0; }
.SUCCESS { background: #1e8e3e; } .FAILURE { background: #c5221f; }
.ok { color: #1e8e3e; } .bad { color: #c5221f; font-weight: bold; }
.warn { color: #a05a00; }
tr.flagged td, td.flagged { background: #fde8e7; }
.regression { color: #c5221f; font-weight: bold; }
.muted { color: #666; }
ul.reasons li { color: #c5221f; }
div.wide { overflow-x: auto; }
details { margin: 0.3em 0; } summary { cursor: pointer; }
img.plot { max-width: 100%; border: 1px solid #eee; }
footer { margin-top: 2em; font-size: 0.8em; color: #666; }
"""


def esc(value: object) -> str:
    """Text for HTML (None is empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


def tag(name: str, content: str, **attrs: object) -> str:
    """<name attrs>content</name>; `class_` is written `class`; content is HTML (escape it first)."""
    shown = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{esc(value)}"'
        for key, value in attrs.items()
        if value is not None
    )
    return f"<{name}{shown}>{content}</{name}>"


def link(href: str, text: str | None = None) -> str:
    """A relative link (each path part quoted) with `text` (default: the path)."""
    return tag("a", esc(text if text is not None else href), href=quote(href))


def relative_link(target: Path, page: Path, text: str | None = None) -> str:
    """A link from the page at `page` to `target`, relative (a copied directory keeps working)."""
    rel = os.path.relpath(os.path.abspath(target), os.path.dirname(os.path.abspath(page)))
    return link(rel.replace(os.sep, "/"), text if text is not None else target.name)


def cell(value: object, numeric: bool = False, flagged: bool = False, raw: bool = False) -> str:
    classes = " ".join(c for c, on in (("num", numeric), ("flagged", flagged)) if on) or None
    return tag("td", value if raw and isinstance(value, str) else esc(value), class_=classes)


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], id_: str | None = None, class_: str | None = None
) -> str:
    """A table whose rows are lists of <td> cells already made (cell())."""
    head = "<tr>" + "".join(tag("th", esc(h)) for h in headers) + "</tr>"
    body = "\n".join(row if isinstance(row, str) else "<tr>" + "".join(row) + "</tr>" for row in rows)
    return tag("table", f"\n{head}\n{body}\n", id=id_, class_=class_)


def simple_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[int] = ()
) -> str:
    """A table of plain values (escaped); columns in `numeric` right-aligned."""
    return table(headers, ([cell(v, i in numeric) for i, v in enumerate(row)] for row in rows))


def section(title: str, body: str, id_: str) -> str:
    return tag("section", f"\n{tag('h2', esc(title))}\n{body}\n", id=id_)


def paragraph(text: str, class_: str | None = None) -> str:
    return tag("p", esc(text), class_=class_)


def preformatted(text: str, limit: int = MAX_INLINE_CHARS) -> str:
    """<pre> of text, cut at `limit` characters with a note."""
    if len(text) > limit:
        text = text[:limit] + f"\n... (cut at {limit} characters; the file has more)"
    return tag("pre", esc(text))


def png_image(data: bytes, alt: str) -> str:
    """A PNG inline (a data: URI): the page needs no file beside it."""
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{encoded}">'


def seconds(value: object) -> str:
    """A duration as the tables show it: `12.35` (two decimals), `-` when unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.2f}"


def document(title: str, body: str) -> str:
    """The whole page: nothing in it refers to anything outside it but the relative links."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n"
        f"<footer>Written by slurm-multi {esc(__version__)} (slurm-multi report); "
        "self-contained: no script, nothing fetched.</footer>\n</body>\n</html>\n"
    )


def write_page(path: Path, text: str) -> None:
    """The page, atomically (a browser never sees half of it); a failure is one line."""
    try:
        shell.write_atomic(path, text, mode=None)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise HelperError(f"{AREA}: cannot write {path}: {why}; is {path.parent} writable?") from None
