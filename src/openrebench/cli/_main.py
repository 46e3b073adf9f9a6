"""The `openrebench` app: every command module's commands, registered in the order `--help` lists them."""

from __future__ import annotations

import typer

from . import _analysis, _build, _calibrate, _eval, _info, _runs

app = typer.Typer(help="Open, runnable RE-Bench: ML research-engineering environments.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

app.command("list")(_info.list_)
app.command()(_info.info)
app.command()(_runs.start)
app.command()(_runs.score)
app.command()(_runs.shell)
app.command()(_runs.log)
app.command()(_runs.result)
app.command()(_calibrate.calibrate)
app.command()(_build.build)
app.command()(_runs.demo)
app.command("eval", cls=_eval.EvalCommand)(_eval.eval_)
app.command()(_analysis.analyze)
app.command()(_analysis.report)


def main() -> None:
    app()
