"""Every output path of every command is checked the same way before any work: a missing parent
folder is one line naming the argument, exit 2, and nothing is created (no folder, no file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tag_core.cli import main

TOPOLOGY = str(Path(__file__).resolve().parents[1] / "examples" / "topologies" / "testbed.json")

# (command line with {out} for the output path, the argument named in the error, a file (or a folder) output)
COMMANDS = {
    "plan --out": (["plan", "mlp", "--topology", TOPOLOGY, "--out", "{out}"], "--out", "file"),
    "simulate --timeline": (["simulate", "mlp", "--topology", TOPOLOGY, "--strategy", "dp-nccl", "--timeline", "{out}"],
                            "--timeline", "file"),
    "emit --out": (["emit", "mlp", "--topology", TOPOLOGY, "--strategy", "dp-nccl", "--out", "{out}"], "--out", "folder"),
    "profiles export --out": (["profiles", "export", "--out", "{out}"], "--out", "file"),
    "topology random --out": (["topology", "random", "--seed", "3", "--out", "{out}"], "--out", "file"),
    "topology probe --out": (["topology", "probe", "--out", "{out}"], "--out", "file"),
    "topology discover --out": (["topology", "discover", "--probes", "probes", "--out", "{out}"], "--out", "file"),
    "report --out": (["report", "--out", "{out}"], "--out", "folder"),
    "train-gnn --out": (["train-gnn", "--out", "{out}", "--generations", "1"], "--out", "file"),
    "calibrate --local --out": (["calibrate", "--local", "2", "--out", "{out}"], "--out", "file"),
    "train --out": (["train", "mlp", "--topology", TOPOLOGY, "--strategy", "single", "--data", "digits.npz",
                     "--out", "{out}"], "--out", "folder"),
}


def run(command: list[str], out: Path) -> int:
    return main([str(out) if part == "{out}" else part for part in command])


@pytest.mark.parametrize("name", list(COMMANDS))
def test_missing_parent_folder_is_refused_and_not_created(name, tmp_path, tag_home, capsys):
    command, argument, kind = COMMANDS[name]
    missing = tmp_path / "no" / "such"
    out = missing / ("x.png" if "timeline" in name else "out.json" if kind == "file" else "dir")
    assert run(command, out) == 2
    err = capsys.readouterr().err
    assert err == f"tag: error: {argument}: directory {str(missing)!r} does not exist\n"
    assert not (tmp_path / "no").exists()
    assert not tag_home.exists() or not any(tag_home.iterdir())  # the store was not even opened


@pytest.mark.parametrize("name", [n for n, (_, _, kind) in COMMANDS.items() if kind == "file"])
def test_a_folder_given_as_an_output_file_is_refused(name, tmp_path, capsys):
    command, argument, _ = COMMANDS[name]
    folder = tmp_path / ("charts.png" if "timeline" in name else "a-folder.json")
    folder.mkdir()
    assert run(command, folder) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tag: error: {argument}: ") and "is a directory" in err
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("name", [n for n, (_, _, kind) in COMMANDS.items() if kind == "folder"])
def test_a_file_given_as_an_output_folder_is_refused(name, tmp_path, capsys):
    command, argument, _ = COMMANDS[name]
    file = tmp_path / "taken"
    file.write_text("mine\n")
    assert run(command, file) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tag: error: {argument}: ")
    assert file.read_text() == "mine\n"


def test_every_output_argument_of_every_command_is_covered():
    """A new output argument (--out, --timeline, --export, ...) needs a case above."""
    from tag_core.cli import build_parser

    outputs = set()
    parser = build_parser()
    for action in parser._subparsers._group_actions:
        for name, sub in action.choices.items():
            nested = [(name, sub)]
            if sub._subparsers is not None:
                nested = [(f"{name} {n}", s) for a in sub._subparsers._group_actions for n, s in a.choices.items()]
            for full, command in nested:
                for arg in command._actions:
                    if any(o in ("--out", "--timeline", "--export") for o in arg.option_strings):
                        outputs.add(f"{full} {arg.option_strings[0]}")
    covered = {f"{' '.join(cmd[:2]) if cmd[0] in ('profiles', 'topology') else cmd[0]} {arg}"
               for cmd, arg, _ in COMMANDS.values()}
    # calibrate --export writes through the same check (write_atomically), after finding the calibration.
    assert outputs - covered == {"calibrate --export"}
