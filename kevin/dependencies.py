"""A stage started before the README's install stops with one line that says what to install, not a traceback
from deep in an import."""
import importlib.util


def require(*modules: str) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"error: not installed: {', '.join(missing)}. Install first: pip install -e . "
                         "(the README's first lines)")
