"""Every command the README and docs/ show for an entry script (prepare.py, train.py, evaluate.py, predict.py,
sweep.py) parses with that script's own argument parser, loads its config with every override and passes the checks
the script makes before any work; a prepare command also passes the checks prepare makes before its first stage
(runner.check_before_stages). docs/long-documents.md's recipe was refused by such a check ("128 less its 127
special tokens") while the docs said it ran: a documented command cannot rot unnoticed now.

What is not run: the work itself (hours for some recipes). A command's shell variables (S="...") are expanded
as the shell would; synopsis lines (`[--config ...]`, `<config>`, `...`) are not commands and are passed over."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPTS = ("prepare", "train", "evaluate", "predict", "sweep")
_COMMAND = re.compile(r"(?:python|accelerate launch)\b[^&;#]*?pipeline/(?:" + "|".join(SCRIPTS) + r")\.py[^&;#\n]*")
_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)\s*$")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where: file:line, script, argv after the script) of every entry-script command in a fenced code block."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
            first = text.count("\n", 0, block.start(1)) + 1
            variables: dict[str, str] = {}
            for offset, line in enumerate(block.group(1).replace("\\\n", " \n").splitlines()):
                if (m := _ASSIGN.match(line)) is not None:
                    variables[m.group(1)] = shlex.split(m.group(2))[0]
                    continue
                for cmd in _COMMAND.finditer(line):
                    expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                                      lambda v: variables.get(v.group(1), v.group()), cmd.group())
                    if re.search(r"[<\[]|\.\.\.|\$", expanded.replace("=[]", "")):
                        continue  # a synopsis or a placeholder, not a command
                    words = shlex.split(expanded)
                    at = next(k for k, w in enumerate(words) if re.fullmatch(r"pipeline/\w+\.py", w))
                    found.append((f"{path.relative_to(REPO)}:{first + offset}", Path(words[at]).stem, words[at + 1:]))
    return found


COMMANDS = documented_commands()


class _Checked(Exception):
    """Raised where the script would start its work: everything before passed."""


def _stop_before_work(script: str, monkeypatch) -> None:
    import importlib

    from pipeline import checks, tasks

    module = importlib.import_module(f"pipeline.{script}")
    if script == "sweep":
        from pipeline.sweeps import space, study

        def opened(spec_path, config_path, overrides, trials=None, storage=""):
            spec = space.read_spec(spec_path)
            checks.load_config(config_path, overrides)
            space.distributions(spec, config_path, overrides, str(spec_path))
            raise _Checked

        monkeypatch.setattr(study, "open_sweep", opened)
        return

    if script == "predict":  # its config is the run's recorded one: the overrides are checked on the default's

        def recorded(args):
            from pipeline.config import arg_overrides

            checks.load_config(args.config, arg_overrides(args))
            raise _Checked

        monkeypatch.setattr(module, "config_from_args", recorded)
        return

    def configured(args, extra=None):
        cfg = checks.config_from_args(args, extra)
        if script == "prepare":
            from pipeline.data import runner

            task = tasks.get(cfg.task)
            runner.check_before_stages(cfg, runner.stage_table(cfg, task))
        raise _Checked

    monkeypatch.setattr(module, "config_from_args", configured)


def test_the_docs_show_commands_of_every_entry_script():
    """The extraction finds what is there (a regex that matched nothing would make the test below vacuous)."""
    scripts = {script for _, script, _ in COMMANDS}
    assert scripts == set(SCRIPTS) and len(COMMANDS) >= 20, COMMANDS
    where = {w.split(":")[0] for w, _, _ in COMMANDS}
    assert {"README.md", "docs/long-documents.md", "docs/language-models.md", "docs/lora.md", "docs/predict.md"} <= where
    recipe = [argv for w, s, argv in COMMANDS if w.startswith("docs/long-documents.md") and s == "prepare"]
    assert recipe and "tokenize.truncation=head_tail" in recipe[0] and "tokenize.max_length=128" in recipe[0]


@pytest.mark.parametrize(("where", "script", "argv"), COMMANDS, ids=[f"{w} {s}" for w, s, _ in COMMANDS])
def test_a_documented_command_parses_and_passes_the_checks_before_any_work(where, script, argv, monkeypatch):
    monkeypatch.chdir(REPO)  # the docs' paths are the repository's
    _stop_before_work(script, monkeypatch)
    import importlib

    with pytest.raises(_Checked):
        importlib.import_module(f"pipeline.{script}").main(argv)
