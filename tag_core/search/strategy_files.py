"""Strategies given by the user: a baseline's name, one option for every op, or a strategy or plan JSON file.

`tag simulate`, `sfb` and `emit` read them alike; errors name the argument they came from.
"""

from __future__ import annotations

from pathlib import Path


def load_strategy(text: str, sim):
    """A baseline name, an option applied to every op on every device (allreduce, ps, duplicate,
    model_parallel), or a JSON file holding a strategy (or a plan that embeds one)."""
    from tag_core.simulate.strategy import Strategy

    from .baselines import baseline

    if is_strategy_file(text):
        return read_plan_file(text)[1]
    if check_strategy_name(text) == "option":
        option = text.lower().replace("-", "_")
        return Strategy.uniform(sim.n, sim.topology.num_machines, sim.num_devices, option, name=option)
    return baseline(text, sim)


def check_strategy_name(text: str) -> str:
    """"baseline" or "option" for a strategy given by name; TagInputError naming both lists otherwise."""
    from tag_core.errors import TagInputError
    from tag_core.simulate.strategy import OPTIONS

    from .baselines import BASELINES, baseline_name

    if text.lower().replace("-", "_") in OPTIONS:
        return "option"
    try:
        baseline_name(text, "--strategy")
    except TagInputError:
        raise TagInputError("--strategy", f"unknown baseline {text!r}; known: {', '.join(BASELINES)}, or one option "
                                          f"for every op: {', '.join(OPTIONS)} (or a strategy/plan .json file)") from None
    return "baseline"


def is_strategy_file(text: str) -> bool:
    """A .json name, or a path that exists and is no strategy's name (a folder `ps` does not hide ps)."""
    if text.lower().endswith(".json"):
        return True
    if not Path(text).exists():
        return False
    from tag_core.errors import TagInputError

    try:
        check_strategy_name(text)
    except TagInputError:
        return True
    return False


def read_plan_file(text: str, argument: str = "--strategy"):
    """(the file's JSON, its strategy) for a strategy or plan file; errors name `argument`."""
    from tag_core.errors import TagInputError
    from tag_core.files import input_file, read_json
    from tag_core.simulate.strategy import Strategy

    path = input_file(text, argument)
    data = read_json(path, argument)
    try:
        return data, Strategy.from_dict(data)
    except TagInputError as exc:
        raise TagInputError(f"{argument} {text}: {exc.where}", exc.problem) from None
