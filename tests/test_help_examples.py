"""Every command's --help ends with real examples, and each one is a command line the
command accepts: it names options that exist, with values of their types, nothing missing."""

from __future__ import annotations

import shlex

import click
import pytest

from tracestream.cli import main


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        yield path + (name,), command
        if isinstance(command, click.Group):
            yield from _commands(command, path + (name,))


COMMANDS = list(_commands(main))


def _examples(path: tuple[str, ...], command: click.Command) -> list[str]:
    with click.Context(command, info_name=" ".join(("tracestream",) + path)) as ctx:
        text = command.get_help(ctx)
    lines = [line.strip() for line in text.splitlines()]
    assert "Examples:" in lines, f"tracestream {' '.join(path)} --help has no examples"
    return [line for line in lines[lines.index("Examples:") + 1:] if line]


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_help_ends_with_examples_the_command_accepts(path, command):
    examples = _examples(path, command)
    assert 1 <= len(examples) <= 3
    for example in examples:
        words = shlex.split(example)
        words = words[words.index("tracestream"):]  # after `zcat t.json.gz |`, if any
        assert tuple(words[1:1 + len(path)]) == path, example
        args = words[1:]
        chosen: click.Command = main
        while isinstance(chosen, click.Group):
            name = args.pop(0)
            chosen = chosen.get_command(click.Context(chosen), name)
            assert chosen is not None, example
        chosen.make_context(name, args)  # click's refusal of an unknown or missing option


def test_an_example_with_a_missing_option_is_caught():
    """The check above is not a formality: a required option left out fails to parse."""
    layers = main.get_command(click.Context(main), "layers")
    with pytest.raises(click.MissingParameter):
        layers.make_context("layers", ["--trace", "t.json", "--output", "o.json"])
