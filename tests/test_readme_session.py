"""CPU: the command-line session printed in README.md works as printed on a machine without a
GPU: each command is run against a fresh cache directory and its output compared with the
README's, with run-dependent values (timings, sizes, hashes, the directory) masked."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
DEMO_DIR = "/tmp/cutequant-demo"
MASKS = [
    (r"\d+\.\d+ s\b", "<t> s"),
    (r"\(\d+\.\d+ MB\)", "(<n> MB)"),
    (r"sources [0-9a-f]{16}", "sources <hash>"),
    (r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(kernel/s|s/kernel)\]", "[<rate>]"),
]


def session_block() -> str:
    text = README.read_text()
    start = text.index("## Command line and kernel cache")
    block = text[text.index("```console", start) + len("```console\n") :]
    return block[: block.index("```")]


def parse(block: str) -> list[tuple[str, str]]:
    """[(command, expected output)] from ``$ command`` lines and the lines below them."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in steps]


def run_step(command: str, cache_dir: str) -> str:
    env = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        "CUTEQUANT_CACHE_DIR": cache_dir,
        "COLUMNS": "100",
    }
    env.pop("CUTEQUANT_DISABLE_DISK_CACHE", None)
    # stderr into stdout in order; bytes, not text: text mode would turn the progress bar's
    # carriage returns into newlines
    done = subprocess.run(
        ["bash", "-c", f'{{ {command}; }} 2>&1; echo "exit $?"'],
        env=env,
        stdout=subprocess.PIPE,
        timeout=900,
    )
    out = done.stdout.decode()
    # a progress bar redraws its line with \r: keep what the terminal shows at the end
    return "\n".join(line.split("\r")[-1] for line in out.rstrip("\n").split("\n"))


def mask(text: str, cache_dir: str) -> str:
    text = text.replace(cache_dir, DEMO_DIR)
    for pattern, repl in MASKS:
        text = re.sub(pattern, repl, text)
    return text


def test_readme_session_runs_as_printed(tmp_path):
    cache_dir = str(tmp_path / "cutequant-demo")
    steps = parse(session_block())
    commands = [cmd for cmd, _ in steps]
    assert commands[1].startswith("cutequant precompile")  # the command for a CPU-only machine
    for command, expected in steps:
        if command.startswith("export "):
            assert command == f"export CUTEQUANT_CACHE_DIR={DEMO_DIR}" and expected == ""
            continue
        got = run_step(command, cache_dir)
        status = got.rsplit("\n", 1)[-1]
        got = got.rsplit("\n", 1)[0] if "\n" in got else ""
        want_status = "exit 2" if "--arch sm_89" in command else "exit 0"
        assert status == want_status, (command, got)
        assert mask(got, cache_dir) == mask(expected, DEMO_DIR), command
