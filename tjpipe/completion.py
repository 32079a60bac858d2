"""Shell completion scripts for bash, zsh and fish, made from the argparse tree ``cli.build_parser`` builds.

Generated rather than written by hand so that a new command or flag completes the day it is added; small
and local rather than a dependency, since all it needs is the commands, their flags, and the values a flag
or positional accepts. zsh reuses the bash function through zsh's ``bashcompinit``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field


@dataclass
class _Option:
    flags: list[str]
    help: str
    takes_value: bool
    choices: list[str]


@dataclass
class _Command:
    path: str
    """The words after ``tjpipe`` that lead here, space-separated ("" for the top level)."""
    options: list[_Option] = field(default_factory=list)
    commands: dict[str, tuple[str, _Command]] = field(default_factory=dict)
    """Subcommand name -> its help and node."""
    values: list[str] = field(default_factory=list)
    """Choices of positional arguments."""


def _tree(parser: argparse.ArgumentParser, path: str = "") -> _Command:
    node = _Command(path=path)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                child = _tree(sub, f"{path} {name}".strip())
                node.commands[name] = (helps.get(name, ""), child)
        elif action.option_strings:
            node.options.append(
                _Option(
                    flags=list(action.option_strings),
                    help=(action.help or "").replace("%%", "%") if action.help != argparse.SUPPRESS else "",
                    takes_value=action.nargs != 0,
                    choices=[str(c) for c in action.choices or ()],
                )
            )
        elif action.choices:
            node.values.extend(str(c) for c in action.choices)
    return node


def _walk(node: _Command) -> list[_Command]:
    found = [node]
    for _, child in node.commands.values():
        found.extend(_walk(child))
    return found


def _bash_word(text: str) -> str:
    return '"' + text + '"'


def _bash(root: _Command, prog: str) -> str:
    nodes = _walk(root)
    fn = f"_{prog.replace('-', '_')}_complete"
    transitions = "\n".join(
        f'            "{node.path}:{name}") path="{child.path}" ;;'
        for node in nodes
        for name, (_, child) in node.commands.items()
    )
    words = "\n".join(
        f'        "{node.path}") opts="{" ".join(f for o in node.options for f in o.flags)}"; '
        f'words="{" ".join([*node.commands, *node.values])}" ;;'
        for node in nodes
    )
    values = "\n".join(
        "        "
        + "|".join(_bash_word(f"{node.path}:{flag}") for flag in option.flags)
        + ") "
        + (
            'COMPREPLY=($(compgen -W "' + " ".join(option.choices) + '" -- "$cur")); return ;;'
            if option.choices
            else "COMPREPLY=(); return ;;"
        )
        for node in nodes
        for option in node.options
        if option.takes_value
    )
    return f"""# {prog} completion for bash (and zsh through bashcompinit): source <({prog} completion bash)
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="" opts="" words="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "$path:${{COMP_WORDS[i]}}" in
{transitions}
        esac
    done
    case "$path:$prev" in
{values}
    esac
    case "$path" in
{words}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F {fn} {prog}
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(root: _Command, prog: str) -> str:
    fn = f"__{prog.replace('-', '_')}"
    lines = [
        f"# {prog} completion for fish: {prog} completion fish | source",
        f"function {fn}_path",
        "    set -l path ''",
        "    for word in (commandline -opc)[2..-1]",
        '        switch "$path:$word"',
    ]
    for node in _walk(root):
        for name, (_, child) in node.commands.items():
            lines += [
                f"            case {_fish_quote(f'{node.path}:{name}')}",
                f"                set path {_fish_quote(child.path)}",
            ]
    lines += [
        "        end",
        "    end",
        "    echo $path",
        "end",
        f"function {fn}_at",
        f"    set -l path ({fn}_path)",
        '    test "$path" = "$argv[1]"',
        "end",
        f"complete -c {prog} -f",
    ]
    for node in _walk(root):
        at = f"-n {_fish_quote(f'{fn}_at {_fish_quote(node.path)}')}"
        for name, (help_text, _) in node.commands.items():
            lines.append(f"complete -c {prog} {at} -a {_fish_quote(name)} -d {_fish_quote(help_text)}")
        if node.values:
            lines.append(f"complete -c {prog} {at} -a {_fish_quote(' '.join(node.values))}")
        for option in node.options:
            parts = [f"complete -c {prog} {at}"]
            for flag in option.flags:
                parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
            if option.choices:
                parts.append(f"-x -a {_fish_quote(' '.join(option.choices))}")
            elif option.takes_value:
                parts.append("-r -F")
            parts.append(f"-d {_fish_quote(option.help)}")
            lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    prog = parser.prog
    root = _tree(parser)
    if shell == "bash":
        return _bash(root, prog)
    if shell == "zsh":
        return (
            f"#compdef {prog}\n# {prog} completion for zsh: source <({prog} completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(root, prog)
        )
    if shell == "fish":
        return _fish(root, prog)
    raise ValueError(f"no completion for shell {shell!r}: bash, zsh or fish")
