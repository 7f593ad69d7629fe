"""How a stage script starts and ends. Its imports take seconds (torch, transformers): a Ctrl-C among them is one
line, as later, not a traceback from inside them. Its end is quick: no last walk over what those imports made."""
import atexit
import gc
import signal
import sys


class _WhileStarting:
    def __init__(self, what: str):
        self.what = what

    def __call__(self, signum, frame):
        print(f"interrupted: while starting, {self.what}", file=sys.stderr)
        raise SystemExit(130)


def quiet_ctrl_c_while_starting(what: str) -> None:
    """Until `started()`, a Ctrl-C prints `interrupted: while starting, <what>` and exits with status 130; where
    Ctrl-C is ignored (a background job), it stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _WhileStarting(what))


def started() -> None:
    """The run begins: a Ctrl-C is KeyboardInterrupt again, for main() to say how far it got."""
    if isinstance(signal.getsignal(signal.SIGINT), _WhileStarting):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def freeze_at_exit() -> None:
    """At exit, freeze every object (gc.freeze) before Python's last garbage collection, which would walk all that
    torch and transformers made, for a process about to end: ~0.8 s of a core at each exit of a stage script,
    paid by every pipeline stage and every test that runs one."""
    atexit.register(gc.freeze)
