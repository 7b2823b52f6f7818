"""TF children forked from a zygote that imported TensorFlow (tag_core.tf_children) behave as `python -m` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from child_processes import started_by

from tag_core import tf_children

pytestmark = pytest.mark.slow  # each zygote imports TensorFlow once

PROBE = '''
import json, os, sys
preloaded = "tensorflow" in sys.modules
if sys.argv[1:2] == ["sleep"]:
    import time
    print("sleeping", flush=True)
    time.sleep(60)
if sys.argv[1:2] == ["raise"]:
    raise ValueError("the probe failed")
if sys.argv[1:2] == ["message"]:
    sys.exit("a message instead of a code")
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("TAG_PROBE"),
                  "parent": os.getppid(), "session": os.getsid(0), "pid": os.getpid(), "preloaded": preloaded,
                  "stdin": sys.stdin.read(), "path0": sys.path[0]}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
'''


@pytest.fixture
def probe_env(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def probe(env, *args, cwd=None, new_session=False, **kwargs):
    return tf_children.popen([sys.executable, "-m", "probe_module", *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                             start_new_session=new_session, **kwargs)


def test_a_fork_runs_its_module_as_python_m_would(probe_env, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    child = probe({**probe_env, "TAG_PROBE": "first"}, "3", "x y", cwd=work)
    assert isinstance(child, tf_children.ForkedChild)
    out, err = child.communicate(input="fed on stdin", timeout=120)
    assert child.returncode == 3 and child.poll() == 3
    seen = json.loads(out)
    assert seen["argv"] == ["3", "x y"] and seen["cwd"] == str(work) and seen["path0"] == str(work)
    assert seen["probe"] == "first" and seen["stdin"] == "fed on stdin" and err == "to stderr\n"
    assert seen["preloaded"]  # TensorFlow came with the fork
    assert seen["session"] == os.getsid(0)  # in the caller's session (and so its Ctrl-C) unless asked
    # A second child with other late variables forks from the same zygote, in a session of its own if asked.
    again = probe({**probe_env, "TAG_PROBE": "second", "TF_USE_LEGACY_KERAS": "0"}, new_session=True)
    second = json.loads(again.communicate(timeout=60)[0])
    assert second["probe"] == "second" and second["parent"] == seen["parent"] != os.getpid()
    assert second["session"] == second["pid"] and again.returncode == 0
    # Another value of a variable TF reads at import gets another zygote.
    other = probe({**probe_env, "TF_CPP_MIN_LOG_LEVEL": "1"})
    assert json.loads(other.communicate(timeout=120)[0])["parent"] != seen["parent"]


def test_errors_and_signals_end_a_fork_as_they_end_a_process(probe_env):
    failed = probe(probe_env, "raise")
    out, err = failed.communicate(timeout=120)
    assert failed.returncode == 1 and "ValueError: the probe failed" in err
    message = probe(probe_env, "message")
    assert message.communicate(timeout=60)[1].strip() == "a message instead of a code" and message.returncode == 1
    sleeper = probe(probe_env, "sleep", new_session=True)
    assert sleeper.stdout.readline() == "sleeping\n"
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.2)
    os.killpg(sleeper.pid, signal.SIGTERM)  # its own process group, as with start_new_session
    assert sleeper.wait(timeout=30) == -signal.SIGTERM
    killed = probe(probe_env, "sleep")
    assert killed.stdout.readline() == "sleeping\n"
    killed.kill()
    assert killed.wait(timeout=30) == -signal.SIGKILL


def test_run_kills_a_child_past_its_timeout(probe_env):
    with pytest.raises(subprocess.TimeoutExpired):
        tf_children.run([sys.executable, "-m", "probe_module", "sleep"], env=probe_env, timeout=8)
    assert started_by("probe_module") == []  # killed and reaped before run raised
    done = tf_children.run([sys.executable, "-m", "probe_module", "5"], env=probe_env, timeout=60)
    assert done.returncode == 5 and done.stderr == "to stderr\n"


def test_a_dead_zygote_reports_its_forks_killed_and_is_replaced(probe_env):
    sleeper = probe(probe_env, "sleep")
    assert sleeper.stdout.readline() == "sleeping\n"
    with open(f"/proc/{sleeper.pid}/stat") as stat:
        zygote = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(zygote, signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    after = probe(probe_env)
    assert json.loads(after.communicate(timeout=120)[0])["parent"] not in (zygote, os.getpid())


def test_plain_processes_where_no_fork_applies(probe_env):
    disabled = probe({**probe_env, tf_children.DISABLE_ENV: "0"})
    assert isinstance(disabled, subprocess.Popen)
    seen = json.loads(disabled.communicate(timeout=120)[0])
    assert not seen["preloaded"] and seen["parent"] == os.getpid()
    script = tf_children.popen([sys.executable, "-c", "print('plain')"], stdout=subprocess.PIPE, text=True)
    assert isinstance(script, subprocess.Popen) and script.communicate(timeout=60)[0] == "plain\n"
