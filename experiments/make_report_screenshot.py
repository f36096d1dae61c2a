"""Render the HTML report for GPT-3 175B on h100x1024 and screenshot it in headless Chromium.

    python experiments/make_report_screenshot.py [--out experiments/report_screenshot.png] [--html FILE]

The report compares a good hand plan (TP 8 inside NVLink, PP 8 with the zero-bubble ZB-V
schedule, DP outermost) with the ``megascale`` recipe, at sequence length 2048 and a global
batch of 1024 sequences.  Needs Debian's ``chromium`` (``apt-get install chromium``); the page
is taken at 1300 px wide and cropped below its last non-white row.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL, CLUSTER, SEQ, GLOBAL_BATCH = "gpt3-175b", "h100x1024", 2048, 1024
HAND_PLAN = "tp=8,pp=8,vpp=2,schedule=zbv,recompute=selective,order=tp-cp-ep-pp-dp"
BASELINE = "megascale"
WIDTH, MAX_HEIGHT = 1300, 8000


def build_html() -> str:
    from autoplan.baselines import baseline
    from autoplan.explain import render_report
    from autoplan.plan import Plan
    from autoplan.workload import Workload

    w = Workload.load(MODEL, CLUSTER, seq=SEQ, global_batch=GLOBAL_BATCH)
    graph, cluster, estimator = w.model, w.cluster, w.estimator()
    plan = Plan.parse(HAND_PLAN, num_gpus=cluster.num_gpus)
    est = estimator.estimate(plan, GLOBAL_BATCH)
    bplan = baseline(BASELINE, graph, cluster, seq=SEQ, global_batch=GLOBAL_BATCH, estimator=estimator)
    best = estimator.estimate(bplan, GLOBAL_BATCH)
    return render_report(MODEL, cluster, [(plan, est), (bplan, best)], estimator, baseline=(bplan, best),
                         baseline_name=BASELINE)


def screenshot(html_path: str, png_path: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium not found: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={WIDTH},{MAX_HEIGHT}",
                        f"--screenshot={png_path}", "file://" + os.path.abspath(html_path)],
                       check=True, capture_output=True, timeout=120)
    crop_white_bottom(png_path)


def crop_white_bottom(png_path: str, margin: int = 24) -> None:
    """Cut the blank space below the page's content."""
    from PIL import Image, ImageChops

    im = Image.open(png_path).convert("RGB")
    box = ImageChops.difference(im, Image.new("RGB", im.size, (255, 255, 255))).getbbox()
    if box:
        im.crop((0, 0, im.width, min(im.height, box[3] + margin))).save(png_path, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "report_screenshot.png"))
    ap.add_argument("--html", help="also keep the HTML report here")
    args = ap.parse_args()
    html = build_html()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.html or os.path.join(tmp, "report.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
        screenshot(path, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
