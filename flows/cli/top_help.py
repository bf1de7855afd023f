"""`veil --help`, drawn from the command table without importing a command module or typer's rich_utils.

typer draws help with `typer.rich_utils`, whose module top imports rich's Markdown (markdown-it),
Syntax (pygments) and Traceback: about 0.15 CPU s of the 0.5 s `veil --help` may take (issue 23). The
top-level listing needs none of them: this module draws the same screen as `rich_utils.rich_format_help`
(same console, theme, highlighters, paddings, panels and tables, same environment switches) from
rich's console, text, table and panel alone, and takes each command's help from `flows.cli.COMMANDS`.
rich itself is imported when the help is drawn: every command imports this module, and a command's
`--json` path draws nothing with rich.

tests/core/test_cli_startup.py compares this drawing with typer's own on the eagerly built group, plain
and in colour; a group option this module does not draw (an argument, a required or defaulted option,
an environment variable, a number range) is handed to typer's drawing instead, so the screen stays
typer's whatever is added to the group.
"""
from __future__ import annotations

import functools
import inspect
import os

from typer.core import TyperOption

# typer.rich_utils' styles (typer 0.29); the test checks they still draw the same
_THEME = {"option": "bold cyan", "switch": "bold green", "negative_option": "bold magenta",
          "negative_switch": "bold red", "types": "bold yellow", "types_sep": "dim", "usage": "yellow"}


@functools.cache
def _highlighters():
    """typer.rich_utils' highlighters: options, negative options, types."""
    from rich.highlighter import RegexHighlighter

    class Option(RegexHighlighter):
        highlights = [
            r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
            r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
            r"(?P<types>\<[^\>]+\>)",
            r"(?P<usage>Usage: )",
        ]

    class Negative(RegexHighlighter):
        highlights = [
            r"(^|\W)(?P<negative_switch>\-\w+)(?![a-zA-Z0-9])",
            r"(^|\W)(?P<negative_option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
        ]

    class Types(RegexHighlighter):
        highlights = [
            r"^(?P<types_sep>(\[|<))",
            r"(?P<types_sep>\|)",
            r"(?P<types_sep>(\]|>))(\.\.\.)?$",
        ]

    return Option(), Negative(), Types()


def _console(highlighter):
    """typer's help console: TERMINAL_WIDTH, FORCE_COLOR / PY_COLORS / GITHUB_ACTIONS and
    _TYPER_FORCE_DISABLE_TERMINAL mean what they mean to typer."""
    from rich.console import Console
    from rich.theme import Theme

    width = os.getenv("TERMINAL_WIDTH")
    force = True if os.getenv("GITHUB_ACTIONS") or os.getenv("FORCE_COLOR") or os.getenv("PY_COLORS") else None
    if os.getenv("_TYPER_FORCE_DISABLE_TERMINAL"):
        force = False
    return Console(theme=Theme(_THEME), highlighter=highlighter, color_system="auto", force_terminal=force,
                   width=int(width) if width else None)


def _simple_flag(param) -> bool:
    """An option this module draws as typer does: no default, range, environment variable or requirement."""
    return (isinstance(param, TyperOption) and not param.required and not param.show_default
            and not isinstance(param.show_default, str) and param.envvar is None and not param.show_envvar
            and param._get_number_range_help_str() is None and getattr(param, "rich_help_panel", None) is None)


def draw(group, ctx, commands: list[tuple[str, str]]) -> None:
    """Print `group`'s help with `commands` ((name, first paragraph of its help), in order) as typer would."""
    params = [p for p in group.get_params(ctx) if not getattr(p, "hidden", False)]
    if not all(_simple_flag(p) for p in params) or group.epilog or group.deprecated:
        from typer import rich_utils  # what this module does not draw: typer's own drawing, complete

        return rich_utils.rich_format_help(obj=group, ctx=ctx, markup_mode=group.rich_markup_mode)
    from rich.align import Align
    from rich.columns import Columns
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    highlighter, negative, types = _highlighters()

    def text(s: str, style: str = "") -> Text:
        """typer's "rich" markup mode: markup parsed, options highlighted (no ANSI-coloured help here)."""
        return highlighter(Text.from_markup(inspect.cleandoc(s), style=style))

    console = _console(highlighter)
    console.print(Padding(highlighter(group.get_usage(ctx)), 1), style="bold")
    if group.help:
        first, *rest = inspect.cleandoc(group.help).partition("\f")[0].split("\n\n")
        parts = [text(first.replace("\n", " ").strip() if not first.startswith("\b") else first.strip())]
        if rest:
            parts += [Text(""), text("\n\n".join(rest), style="dim")]
        console.print(Padding(Align(Group(*parts), pad=False), (0, 1, 1, 1)))
    if params:
        table = Table(highlight=True, show_header=False, expand=True, box=None, show_lines=False, leading=0,
                      border_style=None, row_styles=None, pad_edge=False, padding=(0, 1))
        for p in params:
            long = [o for o in p.opts if "--" in o]
            short = [o for o in p.opts if "--" not in o]
            neg_long = [o for o in p.secondary_opts if "--" in o]
            neg_short = [o for o in p.secondary_opts if "--" not in o]
            kind = Text(style="bold yellow", overflow="fold")
            shown = p.display_type_rich(ctx=ctx)
            if shown is not None:
                kind.append(shown)
            help_ = [text("\n".join(x.replace("\n", " ").strip() for x in p.help.split("\n\n")).strip())] \
                if p.help else []
            table.add_row(highlighter(",".join(long)), highlighter(",".join(short)), negative(",".join(neg_long)),
                          negative(",".join(neg_short)), types(kind), Columns(help_))
        console.print(Panel(table, border_style="dim", title="Options", title_align="left"))
    if commands:
        table = Table(highlight=False, show_header=False, expand=True, box=None, show_lines=False, leading=0,
                      border_style=None, row_styles=None, pad_edge=False, padding=(0, 1))
        table.add_column(style="bold cyan", no_wrap=True, width=max(len(name) for name, _ in commands))
        table.add_column("Description", justify="left", no_wrap=False, ratio=10)
        for name, help_ in commands:
            table.add_row(Text(name), text(help_.strip()))
        console.print(Panel(table, border_style="dim", title="Commands", title_align="left"))
