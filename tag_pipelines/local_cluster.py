"""`make cluster-up` / `make cluster-down`: cluster mode on this one machine.

Starts PostgreSQL (Debian's `postgresql` package), Redis (Debian's `redis-server`), the Dagster daemon and
webserver, and N Celery workers, each bound to loopback, with data, logs and pids under `.cluster/`. Then
writes `.cluster/env`: `source .cluster/env` and every `tag` command or Dagster process uses the shared
store. docs/dagster.md describes the same pieces spread over machines.

    python -m tag_pipelines.local_cluster up [--workers N] [--root .cluster]
    python -m tag_pipelines.local_cluster down [--root .cluster]
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tag_core.errors import TagInputError
from tag_core.files import write_atomically

from .devserver import HOST, ROOT, free_port

POSTGRES_USER = "tag"
DATABASES = ("tag", "dagster")


def postgres_bin(name: str) -> str:
    """A PostgreSQL server binary: Debian keeps them off PATH, under /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise TagInputError("postgresql", f"{name} not found; install Debian's postgresql package")
    return found


def _as_server_user(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package makes the `postgres` user for it.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start_postgres(folder: Path, port: int) -> str:
    """A PostgreSQL server on HOST:port with its data under `folder`, trust auth on loopback only; its URL base."""
    data = folder / "data"
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    if not (data / "PG_VERSION").exists():
        _server_tool([postgres_bin("initdb"), "-D", str(data), "-U", POSTGRES_USER, "--auth=trust", "-E", "UTF8",
                      "--no-sync"])
    options = f"-c listen_addresses={HOST} -p {port} -k {folder} -c fsync=off -c max_connections=200"
    _server_tool([postgres_bin("pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-o", options, "-w",
                  "-t", "60", "start"])
    base = f"postgresql://{POSTGRES_USER}@{HOST}:{port}"
    from tag_core.store.postgres import create_databases

    create_databases(base, list(DATABASES))
    return base


def _server_tool(argv: list[str]) -> None:
    done = subprocess.run(_as_server_user(argv), capture_output=True, text=True, check=False)
    if done.returncode:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise TagInputError("postgresql", f"{Path(argv[0]).name} failed: {lines[-1] if lines else done.returncode}")


def stop_postgres(folder: Path) -> None:
    data = folder / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(_as_server_user([postgres_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True, check=False)


def start_redis(folder: Path, port: int) -> str:
    server = shutil.which("redis-server")
    if not server:
        raise TagInputError("redis", "redis-server not found; install Debian's redis-server package")
    folder.mkdir(parents=True, exist_ok=True)
    # Append-only, so queued steps survive a restart of Redis itself.
    subprocess.run([server, "--bind", HOST, "--port", str(port), "--dir", str(folder), "--daemonize", "yes",
                    "--pidfile", str(folder / "redis.pid"), "--logfile", str(folder / "redis.log"),
                    "--appendonly", "yes", "--save", ""], check=True, capture_output=True)
    return f"redis://{HOST}:{port}/0"


def spawn(argv: list[str], env: dict[str, str], log: Path, pid_file: Path) -> subprocess.Popen:
    """A long-lived process in its own session (one signal stops it and its children), its pid recorded."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    pid_file.write_text(f"{process.pid}\n")
    return process


def worker_argv(name: str) -> list[str]:
    celery = str(Path(sys.executable).with_name("celery"))
    return [celery, "-A", "tag_pipelines.celery_worker", "worker", "-Q", "dagster", "-n", f"{name}@%h",
            "--pool", "solo", "--concurrency", "1", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]


def cluster_env(root: Path, postgres: str, broker: str) -> dict[str, str]:
    return {
        "TAG_ENV": "cluster",
        "TAG_STORE": f"{postgres}/tag",
        # A SQLAlchemy URL: SQLAlchemy 2.1 defaults to psycopg 3, whose server-side parameters dagster-postgres's
        # NOTIFY statements cannot take; psycopg2 is the driver it was written for.
        "DAGSTER_PG_URL": f"{postgres.replace('postgresql://', 'postgresql+psycopg2://', 1)}/dagster",
        "TAG_CELERY_BROKER": broker,
        "TAG_ARTIFACTS": str((root / "artifacts").resolve()),
        "DAGSTER_HOME": str((root / "dagster_home").resolve()),
        # What the sensors watch and the model and topology stages read: inputs every machine shares.
        "TAG_TOPOLOGY_DIR": str((root / "inputs" / "topologies").resolve()),
        "TAG_MODELS_FILE": str((root / "inputs" / "models.yaml").resolve()),
    }


def up(root: Path, workers: int, with_dagster: bool = True, visibility_s: int | None = None) -> dict[str, str]:
    """Start everything (`with_dagster=False`: no daemon or webserver, for tests that launch runs themselves)
    and write `root/env`; the settings it holds."""
    root = root.resolve()
    if (root / "env").exists():
        raise TagInputError(str(root / "env"), "exists: the cluster is up already; `make cluster-down` first")
    postgres = start_postgres(root / "postgres", free_port())
    broker = start_redis(root / "redis", free_port())
    settings = cluster_env(root, postgres, broker)
    if visibility_s is not None:
        settings["TAG_CELERY_VISIBILITY_S"] = str(visibility_s)
    home = Path(settings["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "deploy" / "cluster" / "dagster.yaml", home / "dagster.yaml")
    Path(settings["TAG_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings}
    bin_dir = Path(sys.executable).parent
    port = free_port()
    if with_dagster:
        spawn([str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"], env, root / "logs" / "daemon.log",
              root / "pids" / "daemon.pid")
        spawn([str(bin_dir / "dagster-webserver"), "-w", "workspace.yaml", "-h", HOST, "-p", str(port)], env,
              root / "logs" / "webserver.log", root / "pids" / "webserver.pid")
    for index in range(1, workers + 1):
        worker_home = root / "workers" / str(index)  # each its own TAG_HOME: only the store and artifacts shared
        worker_home.mkdir(parents=True, exist_ok=True)
        spawn(worker_argv(f"tag-worker-{index}"), {**env, "TAG_HOME": str(worker_home)},
              root / "logs" / f"worker-{index}.log", root / "pids" / f"worker-{index}.pid")
    lines = [f"export {key}={shlex.quote(value)}" for key, value in settings.items()]
    write_atomically(root / "env", "# written by `make cluster-up`; `source` it\n" + "\n".join(lines) + "\n")
    web = f", webserver http://{HOST}:{port}" if with_dagster else ""
    print(f"cluster up under {root}: PostgreSQL {postgres}, Redis {broker}, {workers} Celery worker(s){web}\n"
          f"source {root / 'env'}")
    return settings


def stop_pid_file(pid_file: Path, timeout_s: float = 30) -> None:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if not _alive(pid):
            break
    pid_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a child of this process that exited stays a zombie until reaped
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def down(root: Path) -> None:
    root = root.resolve()
    for pid_file in sorted((root / "pids").glob("*.pid")):
        stop_pid_file(pid_file)
    redis_pid = root / "redis" / "redis.pid"
    if redis_pid.exists():
        try:
            os.kill(int(redis_pid.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass
    stop_postgres(root / "postgres")
    (root / "env").unlink(missing_ok=True)
    print(f"cluster down; its data stays under {root} (rm -r it to start afresh)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tag_pipelines.local_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--workers", type=int, default=2, help="Celery workers to start (default 2)")
    parser.add_argument("--root", type=Path, default=ROOT / ".cluster", help="where data, logs and pids go")
    parser.add_argument("--visibility-s", type=int, help="seconds before a lost worker's step goes to another "
                        "(TAG_CELERY_VISIBILITY_S; default 900: longer than any step)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers: must be at least 1")
    try:
        up(args.root, args.workers, visibility_s=args.visibility_s) if args.action == "up" else down(args.root)
    except TagInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip().splitlines()
        print(f"error: {shlex.join(map(str, error.cmd))} failed: {detail[-1] if detail else error.returncode}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
