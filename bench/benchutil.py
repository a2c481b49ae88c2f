"""What the side-by-side bench scripts (cpu_step_bench.py, gpt_cpu_bench.py) share."""
import argparse
import json
import subprocess


def last_json(cmd):
    """Runs cmd; its last line of output, as JSON (the PyTorch scripts' result line)."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def parser(doc):
    """The options every side-by-side takes: --build, --python, --json."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--python", default="python3", help="a Python with torch")
    p.add_argument("--json", default="", help="append every run here")
    return p
