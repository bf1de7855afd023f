"""`veil` imports a command's module only when that command runs (issue 23): the command table in
flows/cli/__init__.py (COMMANDS) must say what the modules register, and `veil --help`, drawn from it,
must be the screen typer draws for the real commands."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.core
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

import flows.cli as cli


def _first_paragraph(cmd) -> str:
    """What typer's command list shows of a command's help (rich markup mode)."""
    return inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0].strip()


def _registered() -> dict[str, tuple[str, object]]:
    """Every command the flows/cli/*_cmds.py modules register: name -> (module, click command), built by typer."""
    out: dict[str, tuple[str, object]] = {}
    modules = sorted(p.stem for p in Path(cli.__file__).parent.glob("*_cmds.py"))
    for module in modules:
        group = typer.main.get_group(cli.registered(module))
        for name, cmd in group.commands.items():
            assert name not in out, f"`{name}` is registered by flows/cli/{module}.py and {out[name][0]}.py"
            out[name] = (module, cmd)
    return out


def test_the_table_names_each_command_its_module_and_help():
    real = _registered()
    table = {name: (module, help_) for name, module, help_ in cli.COMMANDS}
    assert len(table) == len(cli.COMMANDS), "a command is listed twice in flows.cli.COMMANDS"
    assert set(table) == set(real), (f"missing from COMMANDS: {sorted(set(real) - set(table))}; "
                                     f"not registered: {sorted(set(table) - set(real))}")
    for name, (module, cmd) in real.items():
        row = (module, _first_paragraph(cmd))
        assert table[name] == row, f"COMMANDS' row for `{name}` is out of date; it is now {(name, *row)!r}"


@pytest.mark.parametrize("width,colour", [(80, False), (137, True)])
def test_veil_help_is_the_screen_typer_draws(monkeypatch, capsys, width, colour):
    """flows.cli.top_help draws what typer.rich_utils draws for the group with the real commands in it."""
    from typer import rich_utils

    ctx_group = typer.main.get_command(cli.app)
    eager = TyperGroup(name="veil", help=ctx_group.help, no_args_is_help=True,
                       commands={name: ctx_group.commands[name] for name, _, _ in cli.COMMANDS})
    monkeypatch.setattr(rich_utils, "MAX_WIDTH", width)
    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", True if colour else None)
    monkeypatch.setenv("TERMINAL_WIDTH", str(width))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("PY_COLORS", raising=False)
    monkeypatch.delenv("_TYPER_FORCE_DISABLE_TERMINAL", raising=False)
    if colour:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)

    ctx = eager.make_context("veil", ["--help"], resilient_parsing=True)
    rich_utils.rich_format_help(obj=eager, ctx=ctx, markup_mode="rich")
    want = capsys.readouterr().out
    ctx = ctx_group.make_context("veil", ["--help"], resilient_parsing=True)
    cli.top_help.draw(ctx_group, ctx, [(n, h) for n, _, h in cli.COMMANDS])
    got = capsys.readouterr().out
    assert ("\x1b[" in got) == colour and "verify" in got
    assert got == want


def test_a_command_and_its_help_are_the_real_ones():
    """`veil X --help` is typer's screen for X, and a mistyped command is still suggested its name."""
    eager = typer.Typer(name="veil", cls=cli._VeilGroup, no_args_is_help=True, add_completion=False)
    for module in ("verify_cmds", "policy_cmds"):
        __import__(f"flows.cli.{module}", fromlist=["register"]).register(eager)
    runner = CliRunner()
    for args in (["verify", "--help"], ["policy", "--help"], ["policy", "check", "--help"]):
        lazy, real = runner.invoke(cli.app, args, terminal_width=100), runner.invoke(eager, args, terminal_width=100)
        assert lazy.exit_code == real.exit_code == 0 and lazy.output == real.output, args
    typo = runner.invoke(cli.app, ["verfy"])
    assert typo.exit_code == 2 and "Did you mean 'verify'" in typo.output


def test_veil_help_imports_no_command_module():
    """The measured saving (bench/startup.py): `veil --help` loads no command module and none of typer's
    rich_utils (Markdown, pygments); `veil verify --help` loads its own module only; neither pydantic."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted(m for m in sys.modules if m.startswith(('flows.cli.', 'typer.rich',"
            " 'pydantic', 'click'))), file=sys.stderr))\n"
            "from flows.cli import main\n"
            "sys.argv = ['veil'] + sys.argv[1:]\n"
            "main()")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for args, modules in ((["--help"], ["flows.cli.top_help"]),
                          (["verify", "--help"], ["flows.cli.common", "flows.cli.top_help", "flows.cli.verify_cmds"])):
        p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        loaded = eval(p.stderr.strip().splitlines()[-1])
        assert [m for m in loaded if m.startswith("flows.cli.")] == modules, loaded
        if args == ["--help"]:
            assert not [m for m in loaded if m.startswith(("typer.rich", "click"))], loaded
        assert not [m for m in loaded if m.startswith("pydantic")], loaded


def test_str_and_bool_values_are_converted_as_typer_converts_them():
    """flows.cli hands a str or bool value through unchanged instead of building typer's pydantic adapter
    (pydantic's import, ~0.2 CPU s of `veil verify`): the same value typer's own conversion returns."""
    from typer._coercion import build_runtime_param

    assert typer.core.build_runtime_param is cli._runtime_param
    # typer's parameters still look the conversion up in typer.core's namespace (a typer upgrade that
    # moved it would silently bring pydantic back: this says so)
    assert "build_runtime_param" in typer.core._TyperParameter.get_runtime_param.__code__.co_names
    verify = typer.main.get_command(cli.app).commands["verify"]
    for p in verify.params:
        kind = p.type_descriptor.annotation
        ours, typers = cli._runtime_param(p.type_descriptor), build_runtime_param(p.type_descriptor)
        assert type(ours) is cli._AsGiven and kind in (str, bool)
        values = ["models:/veil/1", "", "  spaced  ", "ünïcode ε", "--json"] if kind is str else [True, False]
        for v in values:
            got, want = ours.coerce(v, param=p, ctx=None), typers.coerce(v, param=p, ctx=None)
            assert got == want and type(got) is type(want), (p.name, v)
        assert ours.coerce(None, param=p, ctx=None) == typers.coerce(None, param=p, ctx=None)
