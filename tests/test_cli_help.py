"""`fixup --help`: every command and every option says what it does and its default; `--version`."""

from __future__ import annotations

import argparse

import pytest

import fixup
from fixup.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix: str = "fixup"):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


COMMANDS = dict(_commands(build_parser()))


def test_every_subcommand_is_reached() -> None:
    assert {"fixup inspect", "fixup list", "fixup train", "fixup translate", "fixup reproduce", "fixup study",
            "fixup bench", "fixup bench-deep", "fixup lab theory", "fixup lab probe"} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_a_sentence_and_its_default(command: str) -> None:
    parser = COMMANDS[command]
    assert parser.description or command == "fixup lab", f"{command} has no description"
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        text = formatter._expand_help(action) if action.help else ""
        name = "/".join(action.option_strings) or action.dest
        assert len(text.split()) >= 3, f"{command} {name}: no help sentence ({text!r})"
        assert "see TranslationOptions" not in text, f"{command} {name}: placeholder help"
        if action.option_strings:
            assert "default" in text, f"{command} {name}: the help does not give the default ({text!r})"


def test_translate_help_shows_its_own_defaults_and_no_image_options() -> None:
    text = " ".join(COMMANDS["fixup translate"].format_help().split())
    assert "--image-size" not in text and "--mixup-alpha" not in text and "--dataset" not in text
    assert "(default: 0.003)" in text and "(default: 'inverse_sqrt')" in text  # the tiny recipe, not image defaults
    assert "padded tokens per training batch" in text  # --max-tokens' own comment


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"fixup-lab {fixup.__version__}"


def test_inspect_names_the_shortcut_projection_once(capsys) -> None:
    assert main(["inspect", "wide_resnet", "--depth", "10"]) == 0  # a projection where the width changes
    out = capsys.readouterr().out
    assert "projection projection" not in out and out.count("; shortcut projection") == 2


def test_bench_output_has_no_profiler_lines(capfd) -> None:
    from fixup.bench.memory import peak_step_memory

    model = fixup.create_model("resnet20")
    peak_step_memory(lambda: model(__import__("torch").randn(2, 3, 8, 8)).sum().backward(), model, "cpu")
    captured = capfd.readouterr()
    assert "profiler_start" not in captured.err and "USDT" not in captured.err + captured.out


def test_an_unknown_option_before_the_command_is_named(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--nosuch"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "unknown option --nosuch" in err and "required" not in err
