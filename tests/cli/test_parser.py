"""The argparse tree itself: every flag, positional and command explains itself, and completion follows it."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from tjpipe.cli import build_parser
from tjpipe.completion import script


def _parsers(parser: argparse.ArgumentParser, path: str = "tjpipe") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, f"{path} {name}")
    return found


def test_every_flag_positional_and_command_has_help() -> None:
    missing: list[str] = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if (choice.help or "").strip()}
                missing += [f"{path} {name} (command)" for name in action.choices if name not in helped]
            elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == [], "no help text: " + ", ".join(missing)


def _bash_complete(line: str) -> list[str]:
    """What bash offers after ``line`` (words split on spaces; a trailing space starts a new word)."""
    words = line.split(" ")
    program = (
        script(build_parser(), "bash")
        + f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        + "_tjpipe_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, timeout=30)
    return sorted(done.stdout.split())


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_offers_commands_flags_and_values() -> None:
    assert _bash_complete("tjpipe dlq ") == ["list", "retry", "show"]
    assert _bash_complete("tjpipe his") == ["history", "history-server"]
    assert _bash_complete("tjpipe --ver") == ["--version"]
    assert _bash_complete("tjpipe history -o ") == ["json", "table", "yaml"]
    assert _bash_complete("tjpipe dlq show --out") == ["--output"]
    assert _bash_complete("tjpipe completion ") == ["bash", "fish", "zsh"]
    assert _bash_complete("tjpipe keys rotate ") == ["planner", "watcher"]
    assert _bash_complete("tjpipe plan -f ") == []  # a file name: bash's default completion takes over


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_parse(shell: str) -> None:
    text = script(build_parser(), shell)
    if shell == "zsh":
        assert text.startswith("#compdef tjpipe\n") and "bashcompinit" in text
    else:
        assert "complete -c tjpipe -n '__tjpipe_at \\'dlq\\'' -a 'list' -d 'every dead letter'" in text
        assert "complete -c tjpipe -n '__tjpipe_at \\'history\\'' -s o -l output -x -a 'table json yaml'" in text
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: only the text is checked")
    subprocess.run([shell, "-n", "-c", text], check=True, timeout=30)
