"""The Dagster side's layout: one folder per stage under assets/ holding its assets and their checks,
a code location that loads, and resources per environment (TAG_ENV) that build. Real Dagster, no mocks."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from dagster import AssetCheckKey, AssetChecksDefinition, AssetCheckSpec, AssetKey, AssetsDefinition, Definitions
from dagster_duckdb import DuckDBResource

import assets
import sensors
from tag_core.errors import TagInputError
from tag_pipelines import resources
from tag_pipelines.definitions import defs

ROOT = Path(__file__).resolve().parents[1]
STAGE_DIRS = sorted(path for path in (ROOT / "assets").iterdir() if (path / "__init__.py").exists())

# The asset graph other code and the docs name: key -> partitions (None: unpartitioned).
PARTITIONS = {
    "training_graph": "model",
    "op_profiles": "model",
    "op_groups": "model",
    "fusion_plan": "model",
    "cluster_topology": "topology",
    "calibration": "topology",
    "gnn_checkpoint": None,
    "deployment_plan": "model|topology",
    "sfb_decisions": "model|topology",
    "distributed_graph": "model|topology",
    "measured_step": "model|topology",
    "training_run": "model|topology",
}
CHECKS = {
    ("deployment_plan", "plan_fits_memory"),
    ("deployment_plan", "plan_beats_baselines"),
    ("distributed_graph", "graph_matches_single_device"),
    ("measured_step", "measured_step_near_prediction"),
}


def modules_of(package: ModuleType) -> list[ModuleType]:
    """The stage package and every module in its folder."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        found.append(importlib.import_module(info.name))
    return found


def defined_in(assets_def: AssetsDefinition) -> str:
    """The module whose function the asset wraps."""
    return assets_def.op.compute_fn.decorated_fn.__module__


def stage_assets(package: ModuleType) -> dict[AssetKey, AssetsDefinition]:
    """The assets whose functions live in this stage's folder."""
    return {
        value.key: value
        for module in modules_of(package)
        for value in vars(module).values()
        if isinstance(value, AssetsDefinition) and defined_in(value).startswith(package.__name__ + ".")
    }


def declared_checks(module: ModuleType) -> tuple[set[AssetCheckKey], list[AssetCheckSpec]]:
    """What a module declares at its top level: check keys (of specs, lists of specs and @asset_check
    definitions) and the specs themselves."""
    keys, specs = set(), []
    for value in vars(module).values():
        # An AssetCheckSpec is a named tuple itself: only plain lists and tuples hold several.
        for item in value if type(value) in (list, tuple) else [value]:
            if isinstance(item, AssetCheckSpec):
                keys.add(item.key)
                specs.append(item)
            elif isinstance(item, AssetChecksDefinition):
                keys.update(item.check_keys)
    return keys, specs


CHECK_CALLS = {"AssetCheckSpec", "AssetCheckResult", "asset_check", "multi_asset_check"}


def check_code_in(path: Path) -> list[str]:
    """Lines of `path` that make a check spec, a check result or an @asset_check."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in CHECK_CALLS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.extend(f"{path.relative_to(ROOT)}:{node.lineno} @{d.id}" for d in node.decorator_list
                         if isinstance(d, ast.Name) and d.id in CHECK_CALLS)
    return found


@pytest.fixture
def tag_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Set TAG_ENV (None: unset) with TAG_HOME in a temporary directory."""
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "tag_home"))

    def choose(name: str | None) -> Path:
        if name is None:
            monkeypatch.delenv(resources.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(resources.ENV_VAR, name)
        return tmp_path / "tag_home"

    return choose


def test_assets_is_one_folder_per_stage():
    assert [path.name for path in (ROOT / "assets").glob("*.py")] == ["__init__.py"], "a stage is a folder"
    assert sorted(stage.__name__ for stage in assets.STAGES) == [f"assets.{path.name}" for path in STAGE_DIRS]


@pytest.mark.parametrize("folder", STAGE_DIRS, ids=lambda path: path.name)
def test_every_stage_folder_defines_assets(folder: Path):
    stage = importlib.import_module(f"assets.{folder.name}")
    defined = stage_assets(stage)
    assert defined, f"assets/{folder.name}/ defines no asset"
    # The stage's __init__ exports what it defines, so ALL_ASSETS finds it.
    exported = {value.key for value in vars(stage).values() if isinstance(value, AssetsDefinition)}
    assert exported == set(defined)


def test_every_asset_comes_from_exactly_one_stage_folder():
    owners: dict[AssetKey, list[str]] = {}
    for stage in assets.STAGES:
        for key in stage_assets(stage):
            owners.setdefault(key, []).append(stage.__name__)
    assert {key.to_user_string() for key in owners} == set(PARTITIONS)
    assert all(len(names) == 1 for names in owners.values()), owners
    assert {a.key for a in assets.ALL_ASSETS} == set(owners)


def test_every_check_lives_in_the_folder_of_the_asset_it_checks():
    graph_checks = defs.resolve_asset_graph().asset_check_keys
    assert {(key.asset_key.to_user_string(), key.name) for key in graph_checks} == CHECKS
    homes: dict[AssetCheckKey, list[str]] = {}
    for stage in assets.STAGES:
        own_assets = stage_assets(stage)
        specs = []
        for module in modules_of(stage):
            if module.__name__ != f"{stage.__name__}.checks":
                continue
            keys, module_specs = declared_checks(module)
            specs += module_specs
            for key in keys:
                assert key.asset_key in own_assets, f"{module.__name__} checks {key.asset_key.to_user_string()}, " \
                                                    f"which {stage.__name__} does not define"
                homes.setdefault(key, []).append(module.__name__)
        # An asset that carries its checks carries the specs its stage's checks.py declares.
        for assets_def in own_assets.values():
            for spec in assets_def.check_specs:
                assert spec in specs, f"{spec.key} is not declared in {stage.__name__}.checks"
    # Every check of the code location is declared in one stage's checks.py.
    assert set(homes) == graph_checks
    assert all(len(where) == 1 for where in homes.values()), homes


def test_check_code_is_written_only_in_checks_modules():
    paths = [path for folder in ("assets", "sensors", "tag_pipelines") for path in (ROOT / folder).rglob("*.py")]
    outside = [line for path in paths if path.name != "checks.py" for line in check_code_in(path)]
    assert outside == [], "check specs, results and @asset_check belong in the stage's checks.py"


def test_definitions_load_and_keep_their_keys():
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    partitions = {}
    for key in graph.get_all_asset_keys():
        definition = graph.get(key).partitions_def
        names = (None if definition is None else
                 "|".join(dim.name for dim in definition.partitions_defs) if hasattr(definition, "partitions_defs")
                 else definition.name)
        partitions[key.to_user_string()] = names
    assert partitions == PARTITIONS
    assert set(defs.resources) == {"duckdb", "profiling"}
    assert list(defs.sensors) == sensors.SENSORS and list(defs.schedules) == sensors.SCHEDULES


def test_local_is_the_default_environment(tag_env):
    home = tag_env(None)
    assert resources.environment() == resources.DEFAULT_ENV == "local"
    built = resources.build_resources()
    assert built["duckdb"].database == str((home / "tag.duckdb").resolve())
    assert built["profiling"] == resources.ProfilingSettings()


@pytest.mark.parametrize("name", sorted(set(resources.RESOURCES_BY_ENV) - {"cluster"}))  # cluster: a server
def test_resources_build_for_every_environment(tag_env, name: str):
    home = tag_env(name)
    built = resources.build_resources()
    assert set(built) == {"duckdb", "profiling"}
    assert isinstance(built["duckdb"], DuckDBResource) and isinstance(built["profiling"], resources.ProfilingSettings)
    assert built["duckdb"].database == str((home / "tag.duckdb").resolve())
    # The code location loads with them (every resource an asset needs is there) and the store opens.
    Definitions.validate_loadable(Definitions(assets=assets.ALL_ASSETS, asset_checks=assets.ALL_ASSET_CHECKS,
                                              resources=built))
    with resources.open_store(built["duckdb"]) as conn:
        assert conn.execute("SELECT count(*) FROM schema_info").fetchone()[0] == 1
    assert (home / "tag.duckdb").is_file()


def test_cluster_needs_a_postgres_store_url(tag_env, monkeypatch: pytest.MonkeyPatch):
    tag_env("cluster")
    for url in ("", "/some/file.duckdb"):
        monkeypatch.setenv("TAG_STORE", url)
        with pytest.raises(TagInputError, match=r"^TAG_STORE: TAG_ENV=cluster needs a postgresql:// URL"):
            resources.build_resources()


def test_ci_needs_an_explicit_tag_home(tag_env, monkeypatch: pytest.MonkeyPatch):
    tag_env("ci")
    monkeypatch.delenv("TAG_HOME")
    with pytest.raises(TagInputError) as error:
        resources.build_resources()
    assert str(error.value).startswith("TAG_HOME: ") and "\n" not in str(error.value)


@pytest.mark.slow
def test_an_unknown_environment_is_a_one_line_error(tag_env, tmp_path: Path):
    tag_env("prod")
    message = "TAG_ENV: 'prod' is not an environment; use one of: local, ci, cluster"
    with pytest.raises(TagInputError) as error:
        resources.build_resources()
    assert str(error.value) == message
    # The same line reaches whoever loads the code location.
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    (tmp_path / "dagster_home").mkdir()
    done = subprocess.run([str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w",
                           "workspace.yaml"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr
