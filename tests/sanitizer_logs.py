"""`make native-check`'s verdict on the sanitizer logs of a test run: any AddressSanitizer error, and any
leak whose allocation stack passes through _native.c or _json.c. (LeakSanitizer also lists what CPython itself
never frees at exit, about a thousand blocks: those are not ours.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def problems(log_dir: Path) -> list[str]:
    found = []
    for log in sorted(log_dir.glob("asan*")):
        text = log.read_text(errors="replace")
        if "ERROR: AddressSanitizer" in text:
            found.append(f"{log}: {text[text.index('ERROR: AddressSanitizer'):][:2000]}")
        for block in re.split(r"\n(?=(?:Direct|Indirect) leak of)", text):
            if block.startswith(("Direct leak", "Indirect leak")) and ("_native.c" in block or "_json.c" in block):
                found.append(f"{log}: {block[:2000]}")
    return found


if __name__ == "__main__":
    logs = Path(sys.argv[1])
    if not any(logs.glob("asan*")):
        sys.exit(f"no sanitizer logs in {logs}: was the run instrumented?")
    reports = problems(logs)
    print("\n\n".join(reports) or f"sanitizers: no error and no leak from _native.c or _json.c ({len(list(logs.glob('asan*')))} logs)")
    sys.exit(1 if reports else 0)
