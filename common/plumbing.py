"""Plumbing the stages share: errors, atomic writes, reading JSON Lines, seeding, the run-folder lock, child stages.

None of this is the method. It lives once, here, so that each numbered stage keeps only its own algorithm, its flags
and its `main` (the way nanoGPT's train.py imports model.py). The rule, for anyone adding code: a helper of a few
lines may repeat inside a stage; anything over ~10 lines that two files need lives once, in a module like this one.

    fail(msg)                    one line on stderr, exit 2: bad input never ends in a traceback
    write_atomic(path, text)     write a temporary file, then rename: a reader never sees half a file
    read_jsonl(path) -> [(n, r)] every line a JSON object, valid UTF-8, no lone surrogate; errors name file:line
    seed_everything(seed)        random, numpy, torch (CPU and CUDA) from one seed
    with locked(run / "run.lock"):   one writer per run folder (a pid file created exclusively)
    run_child(cmd)               start a child stage, pass SIGINT / SIGTERM on to it, wait for it
    iteration_policy(run, t)     the checkpoint iteration t samples with (04) and updates (05)

Error messages name the place as `path:line: field '...': what is wrong`, the way compilers do.
"""
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


# ----------------------------------------------------------------------------- errors and writes
def fail(msg):
    """Bad input: one line on stderr and exit status 2 (a `with locked(...)` around it still releases the lock)."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def write_atomic(path, text):
    """Write to a temporary file in the same folder, then rename it: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # e.g. interrupted: no half .tmp left behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def jsonl_text(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


# ----------------------------------------------------------------------------- reading: text is data
# A lone UTF-16 surrogate ("\ud800" written as an ASCII escape in JSON) is not text: it cannot be written as UTF-8
# nor tokenized. In a model's reply it is replaced (safe_text); in an input file it is bad input (read_jsonl).
def safe_text(s):
    """s itself if it is valid text; otherwise a copy where a surrogate pair becomes its character, a lone one
    U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def surrogate_field(x, field=""):
    """The first field (dotted path) of a JSON value holding a string that is not valid text, or None."""
    if isinstance(x, str):
        return None if safe_text(x) is x else (field or "(the record)")
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        name = f"{field}.{k}" if field else str(k)
        if isinstance(k, str) and safe_text(k) is not k:
            return safe_text(name)
        found = surrogate_field(v, name)
        if found:
            return safe_text(found)
    return None


def read_text(path, hint=""):
    """A file's text; a missing file or invalid UTF-8 stops with the file (and line)."""
    path = Path(path)
    if not path.is_file():
        fail(f"{path}: file not found{hint}")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}:{data[:e.start].count(bytes([10])) + 1}: invalid UTF-8 (byte {data[e.start]:#04x})")


def read_jsonl(path, hint="", required=()):
    """[(line number, record)] of a JSONL file: every non-empty line a JSON object with the `required` fields and no
    lone surrogate. The first bad line stops with `path:line: ...` (exit 2). `hint` is added to 'file not found'."""
    rows = []
    for n, line in enumerate(read_text(path, hint).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: malformed JSON ({e.msg})")
        if not isinstance(rec, dict):
            fail(f"{path}:{n}: expected a JSON object")
        field = surrogate_field(rec) if "\\u" in line else None
        if field:
            fail(f"{path}:{n}: field '{field[:60]}': a lone UTF-16 surrogate (e.g. \\ud800) is not text")
        for k in required:
            if k not in rec:
                fail(f"{path}:{n}: missing field '{k}'")
        rows.append((n, rec))
    return rows


def read_json(path, hint=""):
    """One JSON document; malformed JSON stops with the file and line."""
    try:
        return json.loads(read_text(path, hint))
    except json.JSONDecodeError as e:
        fail(f"{path}:{e.lineno}: malformed JSON ({e.msg})")


# ----------------------------------------------------------------------------- seeding
def seed_everything(seed):
    """One seed for random, numpy and torch (CPU and CUDA), where they are imported; vLLM takes it in LLM(seed=...)."""
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)
    if "torch" in sys.modules:  # the oracle never imports torch, and stays fast
        sys.modules["torch"].manual_seed(seed)  # seeds CUDA too


# ----------------------------------------------------------------------------- the run folder
def iteration_policy(run, t):
    """The policy iteration t samples with (04) and updates (05): RUN/init_policy at t = 0, else the policy 05 wrote
    in iteration t - 1, RUN/iter_{t-1:03d}/policy."""
    return Path(run) / ("init_policy" if t == 0 else f"iter_{t - 1:03d}/policy")


STARTED_BY = os.getppid()  # the process that started this one, read at import (wait_for)


def wait_for(path, what):
    """Wait until `path` exists (a stage renames its output into place last), polling; fail if the process that
    started this one ends first (pipeline.py's 04 --until: no engine left behind as an orphan)."""
    if not Path(path).exists():
        print(f"waiting for {what}: {path}", flush=True)
    while not Path(path).exists():
        if os.getppid() != STARTED_BY:
            fail(f"the process that started this one ended before {path} appeared")
        time.sleep(0.2)


# ----------------------------------------------------------------------------- one writer per run folder
# The lock is a file created with O_CREAT | O_EXCL (only one process can create it) holding the writer's pid and
# command. A second writer reads it: a live pid -> "held by pid N", exit 2; a dead pid -> stale, removed, retried.
# A child stage started by the holder (pipeline -> 01..06, 06 -> 04) finds the holder's lock named in its
# environment (LOCK_ENV) and writes under it.
LOCK_ENV = "HARNESS_SCALING_LOCKS"  # the lock files held by this process's parents: path=pid;path=pid


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def lock_holder(path):
    """(pid, command) written in a lock file; pid None while it is being written or if it is garbage."""
    try:
        holder = json.loads(path.read_text())
        return int(holder["pid"]), holder.get("command", "?")
    except (OSError, ValueError, KeyError, TypeError):
        return None, "?"


def take_lock(path):
    """Create the lock file; True if we hold it now, False if a parent of ours holds it. Exit 2 if another does."""
    inherited = dict(x.rsplit("=", 1) for x in os.environ.get(LOCK_ENV, "").split(os.pathsep) if "=" in x)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid, command = lock_holder(path)
            if pid is not None and inherited.get(str(path)) == str(pid):
                return False  # our parent's lock
            being_written = pid is None and path.exists() and time.time() - path.stat().st_mtime < 5
            if being_written or pid is not None and pid_alive(pid):
                fail(f"{path} is held by pid {pid} ({command}); wait for it to finish, or stop it "
                     "(a lock whose process is gone is taken over)")
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "command": " ".join(sys.argv)}, f)
        return True


@contextlib.contextmanager
def locked(path):
    """Hold the lock file `path` while the block runs. On the way out (also on SIGTERM, which unwinds like Ctrl-C)
    the lock goes, and so do the folders made for it if they stayed empty: bad input leaves nothing behind."""
    path = Path(path).resolve()
    made = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    if not take_lock(path):
        yield
        return
    before = os.environ.get(LOCK_ENV)
    os.environ[LOCK_ENV] = os.pathsep.join(filter(None, [before, f"{path}={os.getpid()}"]))
    main_thread = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if term == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds: `finally` runs
    try:
        yield
    finally:
        if term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, term)
        if before is None:
            os.environ.pop(LOCK_ENV, None)
        else:
            os.environ[LOCK_ENV] = before
        path.unlink(missing_ok=True)
        for p in made:  # deepest first
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()


# ----------------------------------------------------------------------------- child stages
@contextlib.contextmanager
def stop_signals(on_signal=lambda sig: None):
    """While the block runs, SIGINT / SIGTERM sent to this process do not stop it: each is appended to the list the
    block gets and passed to on_signal(sig) (e.g. on to child processes); the handlers are restored after. Off the
    main thread, where no handler can be set, the list stays empty."""
    got = []

    def handler(sig, frame):
        got.append(sig)
        on_signal(sig)

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    try:
        yield got
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def run_child(cmd, cwd=None, env=None, on_stop=""):
    """Run a child stage and wait for it. SIGINT / SIGTERM sent to this process are passed on to the child (started
    in its own session, so a Ctrl-C reaches it once) and waited for, so stopping a parent stops the whole tree: no
    stage, and no vLLM engine under it, goes on as an orphan. Then this process exits 128 + signal. Returns the
    child's exit status otherwise. `on_stop` is printed when a signal stopped it."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, start_new_session=True)
    with stop_signals(lambda sig: proc.send_signal(sig)) as got:
        rc = proc.wait()
    if got:
        print(f"stopped by {signal.Signals(got[0]).name}: the child ended (exit {rc}). {on_stop}".rstrip(),
              file=sys.stderr)
        raise SystemExit(128 + got[0])
    return rc
