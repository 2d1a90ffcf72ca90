"""Dispatchers: how a claimed bead reaches a worker. Nothing of the web here.

`builtin` (default): the assignment is the dispatch; no external process.
`command`: run CONVOY_DISPATCH_COMMAND without a shell; `{bead}` (or `{}`), `{rig}`,
`{convoy}` and `{worker}` are replaced in each argument, each exactly once (a value holding
`{rig}` stays literal); an argument that only starts with '-' because of a value (a bead id
or rig like `--output=FILE`) is refused, never passed as an option; exit 0 is success.
A template that runs a shell or a remote one (`sh -c '…'`, `ssh host …`, `sudo bash -c …`:
any word naming one of SHELLS) is refused unless CONVOY_DISPATCH_SHELL is on; then every
value is quoted with `shlex.quote`, for one level of shell: write placeholders bare, never
inside quotes of the shell's own command (`sh -c 'gt sling {bead}'`, not `"… '{bead}'"`).
A dotted path names any class with the same `dispatch` method.

A dispatcher may also have `release`: a bead taken back from its worker (the `release`,
`reassign` and `skip` actions) is told to the worker through it. `command` runs
CONVOY_RELEASE_COMMAND for it when set, with the same placeholders and the same rules.
"""

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    output: str = ""


class Dispatcher(Protocol):
    """What CONVOY_DISPATCHER names: `dispatch` hands one claimed bead to its worker."""

    def dispatch(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> Outcome: ...


class Releaser(Protocol):
    """A dispatcher that can tell a worker it no longer has a bead (optional)."""

    def release(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> Outcome: ...


def tells_workers(dispatcher: object) -> bool:
    """Whether `release` reaches a worker through `dispatcher` (a hook that does something)."""
    hook = getattr(dispatcher, "release", None)
    return hook is not None and bool(getattr(dispatcher, "tells_workers", True))


def release(
    dispatcher: object, bead_id: str, rig: str, convoy_id: str, worker: str
) -> Outcome | None:
    """Tell `worker` through the dispatcher's `release`; None when it has none."""
    hook = getattr(dispatcher, "release", None)
    if hook is None:
        return None
    outcome: Outcome = hook(bead_id, rig, convoy_id, worker)
    return outcome


class BuiltinDispatcher:
    name = "builtin"

    def dispatch(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> Outcome:
        return Outcome(ok=True, output=f"assigned {bead_id} to {worker}")


PLACEHOLDER = re.compile(r"\{(bead|rig|convoy|worker|)\}")
# Programs that read their arguments as shell code, here or on another host.
SHELLS = frozenset(
    "sh bash dash zsh ksh mksh ash yash csh tcsh fish busybox eval ssh rsh autossh mosh su".split()
)


def shell_in(template_args: list[str]) -> str | None:
    """The first word of the template naming a shell (by its file name), or None."""
    for arg in template_args:
        if os.path.basename(arg) in SHELLS:
            return arg
    return None


class CommandDispatcher:
    name = "command"
    max_output = 10_000

    def __init__(
        self,
        template: str | None = None,
        timeout: float | None = None,
        shell: bool | None = None,
        release_template: str | None = None,
    ) -> None:
        self.template = template if template is not None else settings.CONVOY_DISPATCH_COMMAND
        self.release_template = (
            release_template if release_template is not None else settings.CONVOY_RELEASE_COMMAND
        )
        self.timeout = timeout if timeout is not None else settings.CONVOY_DISPATCH_TIMEOUT
        self.shell_allowed = shell if shell is not None else settings.CONVOY_DISPATCH_SHELL
        if not self.template.strip():
            raise ValueError("CONVOY_DISPATCHER=command needs CONVOY_DISPATCH_COMMAND")
        self.tokens = shlex.split(self.template)
        self.shell = shell_in(self.tokens)

    def argv(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> list[str]:
        """The command's arguments; ValueError when a value would turn one into an option."""
        if self.shell and not self.shell_allowed:
            raise ValueError(
                f"refusing CONVOY_DISPATCH_COMMAND: it runs a shell ({self.shell[:40]!r}); "
                "set CONVOY_DISPATCH_SHELL=1 to allow it, every value then shell-quoted"
            )
        values = {
            "bead": bead_id,
            "": bead_id,
            "rig": rig or "",
            "convoy": convoy_id or "",
            "worker": worker or "",
        }
        if self.shell:
            values = {key: shlex.quote(value) for key, value in values.items()}
        args = []
        for token in self.tokens:
            arg = PLACEHOLDER.sub(lambda match: values[match[1]], token)  # one pass
            if arg.startswith("-") and not token.startswith("-"):
                raise ValueError(
                    f"refusing to pass {arg[:80]!r} to the command: it starts with '-'"
                )
            args.append(arg)
        return args

    def dispatch(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> Outcome:
        try:
            args = self.argv(bead_id, rig, convoy_id, worker)
        except ValueError as exc:
            return Outcome(False, str(exc))
        return self._run(args)

    @property
    def tells_workers(self) -> bool:
        return bool(self.release_template.strip())

    def release(self, bead_id: str, rig: str, convoy_id: str, worker: str) -> Outcome:
        """Run CONVOY_RELEASE_COMMAND (as the dispatch command is run); with none set the
        worker learns it from its next look at the bead."""
        if not self.release_template.strip():
            return Outcome(True, "", "no CONVOY_RELEASE_COMMAND: nothing run")
        releasing = CommandDispatcher(self.release_template, self.timeout, self.shell_allowed, "")
        try:
            args = releasing.argv(bead_id, rig, convoy_id, worker)
        except ValueError as exc:
            return Outcome(
                False, str(exc).replace("CONVOY_DISPATCH_COMMAND", "CONVOY_RELEASE_COMMAND")
            )
        return self._run(args)

    def _run(self, args: list[str]) -> Outcome:
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            output = ((exc.stdout or b"") + (exc.stderr or b"")).decode(errors="replace")
            return Outcome(False, f"timed out after {self.timeout:g}s", output[-self.max_output :])
        except OSError as exc:
            return Outcome(False, f"cannot run {args[0]!r}: {exc.strerror}")
        output = (done.stdout + done.stderr)[-self.max_output :]
        if done.returncode == 0:
            return Outcome(True, "", output)
        first = (done.stderr.strip() or done.stdout.strip() or "").splitlines()
        reason = first[0] if first else f"exit status {done.returncode}"
        return Outcome(False, reason, output)


def get_dispatcher(name: str | None = None) -> Dispatcher:
    name = name or settings.CONVOY_DISPATCHER
    if name == "builtin":
        return BuiltinDispatcher()
    if name == "command":
        return CommandDispatcher()
    dispatcher: Dispatcher = import_string(name)()
    return dispatcher
