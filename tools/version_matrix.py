"""The fast tests on every minor release of torch's supported range, one venv each, as a table.

    .venv/bin/python tools/version_matrix.py                         # every minor of the range
    .venv/bin/python tools/version_matrix.py --minors 2.7 2.11 2.15 --use .venv --use .venv-newest

For each minor release from the range's lower end (python/gradbridge/requirements.txt) up to the
verified one (python/gradbridge/VERIFIED_TORCH: 2.7 ... 2.15 for ``torch>=2.7.1`` and 2.15), or for
``--minors`` (a newer release is verified this way: run it, then raise VERIFIED_TORCH), it creates
a venv under build/version-matrix/ with this checkout and the newest patch release pip finds for that minor (pip's cache makes a rerun cheap), runs the tests
marked ``every_torch`` or ``every_torch_java`` there (the set `make test` runs on the newest torch:
the Python-side parity, the range's checks, quiet exports, a module exported there trained in a
separate JVM on DJL's libtorch, and the fast in-process Java parity cases on that torch's own
libtorch, through the native library compiled once for it), and deletes the venv again (``--keep``
keeps it: each is ~5 GB). The next release's venv is created while the current one's tests run
(downloads take as long as the tests), so at most two venvs exist at once. ``--use VENV`` reuses an
existing venv for the minor its torch has. Prints a Markdown table (docs/torch-versions.md shows the last one)
and writes it with the details to build/version-matrix.json. Needs `make java` (the Java library).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "python"))

from gradbridge._runtime import libtorch  # noqa: E402  (the range's one definition)
from packaging.version import Version  # noqa: E402

OUT = REPO_ROOT / "build" / "version-matrix"
MARKERS = "every_torch or every_torch_java"  # as `make test` on the newest torch
_CROSS = re.compile(r"torch \S+ vs DJL's libtorch \S+: (.+)")


def minors() -> List[str]:
    """Every minor release from the range's lower end to the verified one: ["2.7", ..., "2.15"]."""
    low, high = _lowest(), Version(libtorch.verified_up_to())
    if low.major != high.major:
        raise SystemExit(f"{libtorch.supported()}: a range across major releases needs a list of minors (--minors)")
    return [f"{low.major}.{minor}" for minor in range(low.minor, high.minor + 1)]


def _lowest() -> Version:
    from packaging.requirements import Requirement

    return next(Version(s.version) for s in Requirement(libtorch.supported()).specifier if s.operator == ">=")


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _torch_of(venv: Path) -> Optional[str]:
    result = subprocess.run([_python(venv), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                            text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def create(minor: str) -> Path:
    """A venv with this checkout (editable) and the newest torch ``minor``.* of the range."""
    venv = OUT / f"torch-{minor}"
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [_python(venv), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{REPO_ROOT}[test]", f"{libtorch.supported()},=={minor}.*"], check=True,
                   cwd=REPO_ROOT)
    return venv


def run_tests(venv: Path) -> Dict[str, object]:
    """The tests marked MARKERS in ``venv``: counts, seconds, and what the cross-version case printed."""
    started = time.monotonic()
    result = subprocess.run([_python(venv), "-m", "pytest", "-m", MARKERS, "-q", "-s", "-p", "no:cacheprovider"],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - started
    tail = [line for line in result.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[0])}
    cross = _CROSS.search(result.stdout)
    status = subprocess.run([_python(venv), "-c", "from gradbridge._runtime import torchscript; "
                             "print(torchscript.deprecation_status().split(' (')[0])"],
                            capture_output=True, text=True).stdout.strip()
    failed = [line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"returncode": result.returncode, "summary": tail[0], "counts": counts, "seconds": round(seconds),
            "failed": failed, "separate_jvm": cross.group(1) if cross else "not run",
            "torchscript": status or "unknown"}


def table(rows: List[dict]) -> str:
    lines = ["| torch | every_torch(_java) tests | time | TorchScript | exported here, trained on DJL's libtorch 2.7.1 |",
             "|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['torch']} | not run: {row['error']} | | | |")
            continue
        counts = row["counts"]
        passed = counts.get("passed", 0)
        failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        names = ", ".join(name.split("::")[-1] for name in row.get("failed", []))
        verdict = f"{passed} passed" + (f", {failed} failed ({names})" if failed else "")
        lines.append(f"| {row['torch']} | {verdict} | {row['seconds']} s | {row['torchscript']} | "
                     f"{row['separate_jvm']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minors", nargs="+", metavar="X.Y", help="only these minor releases (default: the range's)")
    parser.add_argument("--use", action="append", default=[], type=Path, metavar="VENV",
                        help="an existing venv to use for the minor release its torch has")
    parser.add_argument("--keep", action="store_true", help="keep the venvs this run creates")
    args = parser.parse_args(argv)
    wanted = args.minors or minors()
    lowest = _lowest()
    outside = [m for m in wanted if Version(m).release[:2] < lowest.release[:2]]
    if outside:
        parser.error(f"{', '.join(outside)} outside the supported range {libtorch.supported()}")
    existing = {}
    for venv in args.use:
        version = _torch_of(venv)
        if version is None:
            parser.error(f"--use {venv}: no python with torch there")
        existing[".".join(version.split("+")[0].split(".")[:2])] = venv
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    with ThreadPoolExecutor(max_workers=1) as creator:  # one download beside one test run
        pending: Dict[str, Future] = {}

        def prepare(minor: str) -> None:
            if minor not in existing and minor not in pending:
                pending[minor] = creator.submit(create, minor)

        for index, minor in enumerate(wanted):
            prepare(minor)
            try:
                venv = pending[minor].result() if minor in pending else existing[minor]
            except subprocess.CalledProcessError as ex:
                rows.append({"torch": f"{minor}.*", "error": f"venv not created ({ex})"})
                continue
            finally:
                if index + 1 < len(wanted):
                    prepare(wanted[index + 1])
            row = {"torch": _torch_of(venv), "venv": str(venv), **run_tests(venv)}
            rows.append(row)
            print(f"torch {row['torch']}: {row['summary']} ({row['seconds']} s)", flush=True)
            if minor in pending and not args.keep:
                shutil.rmtree(venv)
            _write(rows, argv)  # after every release: a run stopped early keeps what it measured
    print(f"\n{table(rows)}\n\n{_write(rows, argv)}")
    return 0 if all(row.get("returncode") == 0 for row in rows) else 1


def _write(rows: List[dict], argv: Optional[List[str]]) -> str:
    """build/version-matrix.json (rows, table, date, command); returns the date-and-command line."""
    command = " ".join(["tools/version_matrix.py", *(argv if argv is not None else sys.argv[1:])])
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    (OUT.parent / "version-matrix.json").write_text(json.dumps(
        {"date": date, "command": command, "range": libtorch.supported(), "table": table(rows), "rows": rows},
        indent=2) + "\n")
    return f"{date}, `{command}`"


if __name__ == "__main__":
    sys.exit(main())
