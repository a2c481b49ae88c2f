"""What the Python interop scripts share: the executable they drive, a check
that records a failure and goes on, and the ending that counts failures."""
import importlib.util
import os
import sys

failures = []


def check(cond, msg):
    """Records msg as a failure (and prints it) unless cond holds; goes on either way."""
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def require(script, *packages):
    """Exits 2 naming the pip install line unless every package can be imported."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        print(f"{script}: needs the Python package(s) {', '.join(missing)}. "
              f"Install them with: pip install {' '.join(packages)}", file=sys.stderr)
        sys.exit(2)


def tool_path(script, env, what):
    """The executable: the first argument, else $env; exit 2 when neither names a file."""
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(env)
    if not path or not os.path.exists(path):
        print(f"{script}: pass the {what} executable as the argument or in {env}", file=sys.stderr)
        sys.exit(2)
    return path


def finish(script):
    """The exit status: 1 after a count when any check failed, else 0 after 'ok'."""
    if failures:
        print(f"{script}: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print(f"{script}: ok")
    return 0
