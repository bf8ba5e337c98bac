"""The option parser of the click-free hot helpers (`python -m slurm_multi.X`): no click, no argparse.

It parses as click does for the commands it serves (`job plan`, `node prepare`, `results collect`):
`--name VALUE` and `--name=VALUE`, flags, `--x/--no-x` switches, repeatable options, the last of a
repeated option winning, words interspersed with the options, everything after `--` a word, and
`-h`/`--help`. What it refuses is one line (a HelperError, exit 2) naming the option; `--help`
prints the command's options on stdout. The click commands of the same name are passthroughs to
the same `main(argv)` (slurm_multi.cli.passthrough), so each command has this one parser.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slurm_multi.common import usage_error

HELP_NAMES = ("-h", "--help")
FLAG, VALUE, MULTIPLE, SWITCH = "flag", "value", "multiple", "switch"


class Option:
    """One option. A plain class, not a dataclass: importing dataclasses costs the hot path ~1 ms."""

    def __init__(
        self,
        name: str,
        kind: str = VALUE,
        metavar: str = "TEXT",
        help: str = "",  # noqa: A002 - click's word
        default: Any = None,
        convert: Callable[[str], Any] | None = None,
        required: bool = False,
        off: str = "",  # a SWITCH's negative name (--no-write)
        dest: str = "",
        envvar: str = "",  # a VALUE's fallback when not given: this variable, when set and not empty
    ) -> None:
        self.name, self.kind, self.metavar, self.help = name, kind, metavar, help
        self.default = [] if kind == MULTIPLE else (False if kind == FLAG else default)
        self.convert, self.required, self.off = convert, required, off
        self.dest = dest or name.lstrip("-").replace("-", "_")
        self.envvar = envvar

    def shown(self) -> str:
        if self.kind == SWITCH:
            return f"{self.name} / {self.off}"
        return self.name if self.kind == FLAG else f"{self.name} {self.metavar}"


class Given:
    """The parsed options as attributes (by each option's dest), and the words as `args`."""

    def __init__(self, values: dict[str, Any], args: list[str]) -> None:
        self.__dict__.update(values)
        self.args = args


class Parser:
    def __init__(
        self,
        prog: str,
        words: str,
        doc: str,
        options: Sequence[Option],
        min_words: int = 0,
        max_words: int | None = None,
    ) -> None:
        self.prog, self.words, self.doc, self.options = prog, words, doc, list(options)
        self.min_words, self.max_words = min_words, max_words
        self.by_name: dict[str, tuple[Option, Any]] = {}
        for option in self.options:
            self.by_name[option.name] = (option, True)
            if option.off:
                self.by_name[option.off] = (option, False)

    @property
    def area(self) -> str:
        return self.prog.removeprefix("slurm-multi ")

    def fail(self, message: str) -> Exception:
        """One line, in click's words, with the usage (as `slurm-multi X --bad-option` says it)."""
        usage = f"{self.prog} [OPTIONS] {self.words}".rstrip()
        return usage_error(f"{self.area}: {message}; Usage: {usage} (--help lists the options)")

    def parse(self, argv: Sequence[str]) -> Given | None:
        """The options and words of argv; None when it asked for --help (printed on stdout)."""
        values = {o.dest: (list(o.default) if o.kind == MULTIPLE else o.default) for o in self.options}
        before = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
        if any(word in HELP_NAMES for word in before):  # first, as click's eager --help
            sys.stdout.write(self.help_text())
            sys.stdout.flush()
            return None
        given: set[str] = set()
        words: list[str] = []
        rest = list(argv)
        while rest:
            word = rest.pop(0)
            if word == "--":
                words += rest
                break
            if not word.startswith("-") or word == "-":
                words.append(word)
                continue
            name, has_value, value = word.partition("=")
            if name not in self.by_name:
                raise self.fail(f"No such option '{name}'")
            option, on = self.by_name[name]
            given.add(option.dest)
            if option.kind in (FLAG, SWITCH):
                if has_value:
                    raise self.fail(f"Option '{name}' does not take a value")
                values[option.dest] = on
                continue
            if not has_value:
                if not rest:
                    raise self.fail(f"Option '{name}' requires an argument ({option.metavar})")
                value = rest.pop(0)
            value = self._convert(option, f"'{name}'", value)
            if option.kind == MULTIPLE:
                values[option.dest].append(value)
            else:
                values[option.dest] = value
        for option in self.options:  # as click: the variable only where the option is not given
            if option.envvar and option.dest not in given and os.environ.get(option.envvar):
                where = f"'{option.name}' (env var: '{option.envvar}')"
                values[option.dest] = self._convert(option, where, os.environ[option.envvar])
                given.add(option.dest)
        for option in self.options:
            if option.required and option.dest not in given:
                raise self.fail(f"Missing option '{option.name}' ({option.metavar})")
        if len(words) < self.min_words:
            raise self.fail(f"Missing argument '{self.words.split()[0]}'")
        if self.max_words is not None and len(words) > self.max_words:
            raise self.fail(f"Unexpected extra argument {' '.join(words[self.max_words :])!r}")
        return Given(values, words)

    def _convert(self, option: Option, shown: str, value: str) -> Any:
        if option.convert is None:
            return value
        try:
            return option.convert(value)
        except ValueError as exc:
            raise self.fail(f"Invalid value for {shown}: {value!r} {exc}") from None

    def help_text(self) -> str:
        import textwrap

        width = 100
        lines = [f"Usage: {self.prog} [OPTIONS] {self.words}".rstrip(), ""]
        first, _, rest = self.doc.strip().partition("\n")
        lines += [textwrap.indent(first + "\n" + textwrap.dedent(rest), "  ").rstrip(), ""]
        rows = [(o.shown(), o.help + _marks(o)) for o in self.options]
        rows.append(("-h, --help", "Show this message and exit."))
        left = min(30, max(len(shown) for shown, _ in rows))
        lines.append("Options:")
        for shown, text in rows:
            wrapped = textwrap.wrap(text, width - left - 4) or [""]
            if len(shown) > left:
                lines.append(f"  {shown}")
                lines += [f"  {'':<{left}}  {line}" for line in wrapped]
            else:
                lines.append(f"  {shown:<{left}}  {wrapped[0]}")
                lines += [f"  {'':<{left}}  {line}" for line in wrapped[1:]]
        return "\n".join(lines) + "\n"


def whole_number(minimum: int) -> Callable[[str], int]:
    """click.IntRange(min=minimum): a whole number, at least `minimum`."""

    def convert(text: str) -> int:
        number = integer(text)
        if number < minimum:
            raise ValueError(f"is less than {minimum}")
        return number

    return convert


def _marks(option: Option) -> str:
    envvar = f"  [env var: {option.envvar}]" if option.envvar else ""
    return envvar + ("  [required]" if option.required else "")


def integer(text: str) -> int:
    """click's int: any whole number (the command checks its own range)."""
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("is not a whole number") from None


def whole_number_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """click.IntRange(minimum, maximum)."""

    def convert(text: str) -> int:
        number = integer(text)
        if not minimum <= number <= maximum:
            raise ValueError(f"is not in the range {minimum}<=x<={maximum}")
        return number

    return convert


def number_at_least(minimum: float) -> Callable[[str], float]:
    """click.FloatRange(min=minimum): a finite number, at least `minimum`."""

    def convert(text: str) -> float:
        try:
            number = float(text.strip())
        except ValueError:
            raise ValueError("is not a number") from None
        if not number >= minimum or number == float("inf"):
            raise ValueError(f"is not a finite number at least {minimum:g}")
        return number

    return convert


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """click.Choice(choices)."""

    def convert(text: str) -> str:
        if text not in choices:
            raise ValueError(f"is not one of {', '.join(repr(c) for c in choices)}")
        return text

    return convert


def not_a_directory(text: str) -> str:
    """click.Path(dir_okay=False): a path that is not an existing directory."""
    if os.path.isdir(text):
        raise ValueError("is a directory")
    return text


def not_a_file(text: str) -> str:
    """click.Path(file_okay=False): a path that is not an existing file."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise ValueError("is a file")
    return text
