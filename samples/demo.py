"""`make demo`: add layer guides and the compact GPU view to the shipped sample trace.

Runs the installed `tracestream` command exactly as a user would, then `verify`.
Outputs go to demo-out/ (recreated on every run, because tracestream never
overwrites a file).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "decode_8layers.trace.json.gz"
OUT_DIR = ROOT / "demo-out"


def tracestream_command() -> list[str]:
    script = Path(sys.executable).with_name("tracestream")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracestream"]


def main() -> int:
    if OUT_DIR.exists():
        shutil.rmtree(OUT_DIR)
    OUT_DIR.mkdir()
    output = OUT_DIR / "decode_8layers.layers.trace.json.gz"
    layers = tracestream_command() + [
        "layers", "--trace", str(SAMPLE), "--output", str(output),
        "--anchor-regex", "^_q_rope_store$", "--num-layers", "8", "--anchor-offset", "0",
        "--passes", "14", "--extra-anchors-per-pass", "1",
        "--end-anchor-regex", "moe_finalize_all_reduce_kernel<4u, 5120u, 6u>",
        "--phase", "target-verify",
        "--evidence", "generator source: one _q_rope_store per target layer, one extra after "
                      "the last layer (output head); draft passes use _draft_q_rope",
        "--max-gpu-lanes", "10",
    ]
    print("$ " + " ".join(_quote(a) for a in layers[1:]).join(["tracestream ", ""]), flush=True)
    done = subprocess.run(layers)
    if done.returncode:
        return done.returncode
    check = tracestream_command() + ["verify", "--trace", str(SAMPLE), "--output", str(output)]
    print("\n$ tracestream verify --trace " + str(SAMPLE.relative_to(ROOT)) + " --output "
          + str(output.relative_to(ROOT)), flush=True)
    done = subprocess.run(check)
    print(f"\nOpen {output.relative_to(ROOT)} in https://ui.perfetto.dev (Open trace file) and "
          "look for 'Layer guide (target-verify) — anchor intervals' under the GPU process.")
    return done.returncode


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " <>^$;,") else arg


if __name__ == "__main__":
    sys.exit(main())
