"""Commands of this area are registered here (see flows/cli/__init__.py)."""
import typer


def register(app: typer.Typer) -> None:
    pass
