"""Draw the lesson diagrams as tidy, hand-readable SVG files in img/, and check them.

    python scripts/make_diagrams.py [OUTDIR]     # write every diagram (default: img/)
    python scripts/make_diagrams.py --check      # exit 1 if img/ is stale or a label does not fit

Each diagram is a function returning (width, height, title, body); the drawing helpers (svg, box,
text, arrow, link, lines, chip_grid, memory_bar, gpu_card and the palette) live in diagram_kit.py
and can be imported from here. Diagrams are grouped by lessons: diagrams_basics.py (lessons 1-4),
diagrams_parallel.py (lessons 5-7), diagrams_speed.py (lesson 9), diagrams_parallelism.py
(lessons 10-11), diagrams_sync.py (lesson 12) and diagrams_transformer.py (lesson 13). The output
is deterministic (no timestamps), so re-running it changes nothing unless a drawing changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from diagram_kit import (  # noqa: F401 - re-exported: other diagram modules import them from here
    BAD,
    DEV,
    DEV_FILL,
    FONTS,
    GOOD,
    HOST,
    HOST_FILL,
    INK,
    LINK,
    LINK_FILL,
    MUTED,
    STYLE,
    WAIT_FILL,
    arrow,
    box,
    chip_grid,
    gpu_card,
    layout_problems,
    lines,
    link,
    memory_bar,
    svg,
    text,
    text_width,
)
from diagrams_basics import copy_link, devices, pinned, same_device, save_load, sync_timeline
from diagrams_parallel import (
    data_parallel,
    dataparallel_step,
    ddp_buckets,
    torchrun_processes,
    torchrun_restarts,
)
from diagrams_parallelism import combined, three_splits, zero_stages
from diagrams_speed import amp_loss_scaling, channels_last
from diagrams_sync import hierarchy, parameter_server, ring
from diagrams_transformer import causal_pairs, tp_sp_block

from d2l_gpu._fs import write_atomic

ROOT = Path(__file__).resolve().parent.parent

# file name in img/ (without .svg) -> the function that draws it; the lesson that shows it.
DIAGRAMS = {
    "devices": devices,  # lesson 1
    "same-device": same_device,  # lesson 2
    "copy-link": copy_link,  # lesson 3
    "sync-timeline": sync_timeline,  # lesson 3
    "pinned-memory": pinned,  # lesson 3
    "save-load": save_load,  # lesson 4
    "data-parallel": data_parallel,  # lesson 5
    "dataparallel-step": dataparallel_step,  # lesson 6
    "ddp-buckets": ddp_buckets,  # lesson 7
    "torchrun-processes": torchrun_processes,  # lesson 7
    "torchrun-restarts": torchrun_restarts,  # lesson 7
    "channels-last": channels_last,  # lesson 9
    "amp-loss-scaling": amp_loss_scaling,  # lesson 9
    "three-splits": three_splits,  # lesson 10
    "combined-parallelism": combined,  # lesson 11
    "zero-stages": zero_stages,  # lesson 11
    "parameter-server": parameter_server,  # lesson 12
    "ring-allreduce": ring,  # lesson 12
    "hierarchy": hierarchy,  # lesson 12
    "transformer-tp-sp": tp_sp_block,  # lesson 13
    "causal-pairs": causal_pairs,  # lesson 14
}


def render(name: str) -> str:
    """The SVG document of diagram `name`."""
    width, height, title, body = DIAGRAMS[name]()
    return svg(width, height, title, body)


def check(folder: Path) -> list[str]:
    """Every way `folder` differs from a fresh drawing, and every label that does not fit."""
    out = []
    for name in DIAGRAMS:
        document, path = render(name), folder / f"{name}.svg"
        out += [f"{name}.svg: {p}" for p in layout_problems(document)]
        if not path.is_file():
            out.append(f"{name}.svg: missing in {folder}; run python scripts/make_diagrams.py")
        elif path.read_text(encoding="utf-8") != document:
            out.append(f"{name}.svg: stale; run python scripts/make_diagrams.py to redraw it")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        problems = check(ROOT / "img")
        print("\n".join(problems) or f"img/: {len(DIAGRAMS)} diagrams up to date, every label fits")
        return 1 if problems else 0
    out = Path(argv[0]) if argv else ROOT / "img"
    out.mkdir(parents=True, exist_ok=True)
    for name in DIAGRAMS:
        document = render(name)
        for problem in layout_problems(document):
            print(f"warning: {name}.svg: {problem}")
        path = out / f"{name}.svg"
        write_atomic(path, document)  # a reader never sees half a diagram
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
