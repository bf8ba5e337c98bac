"""Read a page's DOM as a browser dumped it (`chromium --headless --dump-dom`): the text of the
element with an id, or of every element with a class, one per line (tests/e2e/75-report.bats).

    report_dom.py DOM_FILE id verdict
    report_dom.py DOM_FILE class reason
    report_dom.py DOM_FILE tags          (every tag name the DOM has, one per line)
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser

VOID = {"meta", "img", "br", "hr", "input", "link", "source", "wbr", "area", "base", "col", "embed", "track"}


class Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.by_class: dict[str, list[str]] = {}
        self.tags: set[str] = set()
        self.open: list[tuple[str, str | None, list[str], list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.add(tag)
        if tag not in VOID:
            self.open.append((tag, found.get("id"), (found.get("class") or "").split(), []))

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            name, id_, classes, parts = self.open.pop()
            text = "".join(parts)
            if self.open:
                self.open[-1][3].append(text)
            if id_:
                self.by_id[id_] = text
            for c in classes:
                self.by_class.setdefault(c, []).append(text)
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1][3].append(data)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("id", "class", "tags") or (argv[1] != "tags" and len(argv) != 3):
        print(__doc__, file=sys.stderr)
        return 2
    dom = Dom()
    with open(argv[0], encoding="utf-8") as handle:
        dom.feed(handle.read())
    dom.close()
    if argv[1] == "tags":
        print("\n".join(sorted(dom.tags)))
    elif argv[1] == "id":
        if argv[2] not in dom.by_id:
            print(f"report_dom: no element with id {argv[2]!r}", file=sys.stderr)
            return 1
        print(dom.by_id[argv[2]].strip())
    else:
        print("\n".join(text.strip() for text in dom.by_class.get(argv[2], [])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
