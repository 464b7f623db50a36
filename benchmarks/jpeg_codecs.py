"""JPEG encode and decode per frame through each Python binding that installs here: the measurement behind
the codec the gateway decodes camera frames with (protos.codec) and the edge encodes raw Images with.

    python benchmarks/jpeg_codecs.py [--frames 300 --quality 90 --turbojpeg-lib PATH --json PATH]

For 224x224 and 480x640 RGB frames (a synthetic scene: gradients, edges and sensor noise, so the bytes per
frame are a camera's, not white noise's), each binding encodes and decodes `--frames` frames one at a time:
p50/p99 wall microseconds per frame, the thread's CPU time per frame (what a shared machine's other load
leaves out), bytes per frame at `--quality` (4:2:0 chroma, what camera drivers send), whether its decode gives
the same pixels as simplejpeg's (all wrap libjpeg-turbo) and how much a Python loop slows down while another
thread decodes (about 1: it releases the GIL, so the gateway's decode pool leaves the event loop running).
Prints a table and writes JSON (default benchmarks/results/jpeg_codecs.json).
PyTurboJPEG needs libturbojpeg (Debian's libturbojpeg0); `--turbojpeg-lib` names the .so where it is not
installed. A binding that does not import is listed with why.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from bench import machine, parser, report, say

SIZES = ((224, 224), (480, 640))
Codec = tuple[Callable[[np.ndarray, int], bytes], Callable[[bytes], np.ndarray]]


def scene(h: int, w: int, seed: int) -> np.ndarray:
    """A camera-like RGB frame: smooth gradients, a few sharp-edged boxes and Gaussian sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([x / w * 200, y / h * 200, (x + y) / (h + w) * 120 + 60], axis=-1)
    for _ in range(6):
        top, left = rng.integers(0, h - h // 4), rng.integers(0, w - w // 4)
        img[top:top + rng.integers(8, h // 4), left:left + rng.integers(8, w // 4)] = rng.integers(0, 255, 3)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def simplejpeg_codec() -> Codec:
    import simplejpeg

    return (lambda a, q: simplejpeg.encode_jpeg(a, q, colorspace="RGB", colorsubsampling="420"),
            lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB"))


def turbojpeg_codec(lib: str | None) -> Codec:
    import turbojpeg

    tj = turbojpeg.TurboJPEG(lib)
    return (lambda a, q: tj.encode(a, q, pixel_format=turbojpeg.TJPF_RGB, jpeg_subsample=turbojpeg.TJSAMP_420),
            lambda b: tj.decode(b, pixel_format=turbojpeg.TJPF_RGB))


def pillow_codec() -> Codec:
    from PIL import Image

    def enc(a: np.ndarray, q: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(a).save(out, "JPEG", quality=q, subsampling=2)
        return out.getvalue()

    return enc, lambda b: np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))


def opencv_codec() -> Codec:
    import cv2

    def enc(a: np.ndarray, q: int) -> bytes:
        ok, out = cv2.imencode(".jpg", cv2.cvtColor(a, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, q])
        return out.tobytes()

    return enc, lambda b: cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR),
                                       cv2.COLOR_BGR2RGB)


def per_frame(fn: Callable, items: list) -> dict:
    """p50/p99 wall and mean CPU microseconds of `fn(item)` over `items`, one call at a time."""
    fn(items[0])
    wall = []
    c0 = time.thread_time()
    for item in items:
        t0 = time.perf_counter_ns()
        fn(item)
        wall.append((time.perf_counter_ns() - t0) / 1e3)
    cpu = (time.thread_time() - c0) / len(items) * 1e6
    return {"p50_us": float(np.percentile(wall, 50)), "p99_us": float(np.percentile(wall, 99)), "cpu_us": cpu}


def gil_held(decode: Callable, blob: bytes) -> float:
    """How much slower a pure-Python loop runs while another thread decodes in a loop: about 1.0 when the
    binding releases the GIL (the gateway's decode pool then leaves its event loop running), 2 or more when not."""
    def spin() -> float:
        t0, x = time.perf_counter(), 0
        for i in range(200_000):
            x += i
        return time.perf_counter() - t0

    alone = min(spin() for _ in range(5))
    stop = threading.Event()
    worker = threading.Thread(target=lambda: [decode(blob) for _ in iter(stop.is_set, True)])
    worker.start()
    try:
        busy = min(spin() for _ in range(5))
    finally:
        stop.set()
        worker.join()
    return busy / alone


def measure(name: str, codec: Codec, frames: dict, quality: int, reference: dict) -> list[dict]:
    encode, decode = codec
    rows = []
    for (h, w), images in frames.items():
        blobs = [encode(a, quality) for a in images]
        ref = reference.get((h, w))
        same = None if ref is None else all(np.array_equal(decode(b), ref(b)) for b in blobs[:5])
        rows.append({"codec": name, "height": h, "width": w, "quality": quality,
                     "bytes_per_frame": int(np.mean([len(b) for b in blobs])),
                     "raw_bytes": h * w * 3,
                     "encode": per_frame(lambda a: encode(a, quality), images),
                     "decode": per_frame(decode, blobs),
                     "python_slowdown_while_decoding": round(gil_held(decode, blobs[0]), 2),
                     "same_pixels_as_simplejpeg": same})
        say(f"{name} {h}x{w} done")
    return rows


def print_table(result: dict) -> None:
    print(f"{'codec':<12} {'frame':>8} {'bytes':>7} {'enc p50':>8} {'enc p99':>8} {'enc cpu':>8} "
          f"{'dec p50':>8} {'dec p99':>8} {'dec cpu':>8} {'GIL x':>6} {'same':>5}   (us per frame)")
    for r in result["results"]:
        e, d = r["encode"], r["decode"]
        print(f"{r['codec']:<12} {r['height']:>4}x{r['width']:<3} {r['bytes_per_frame']:>7} {e['p50_us']:>8.0f} "
              f"{e['p99_us']:>8.0f} {e['cpu_us']:>8.0f} {d['p50_us']:>8.0f} {d['p99_us']:>8.0f} {d['cpu_us']:>8.0f} "
              f"{r['python_slowdown_while_decoding']:>6.2f} {str(r['same_pixels_as_simplejpeg']):>5}")
    for name, why in result["unavailable"].items():
        print(f"{name:<12} unavailable: {why}")


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--frames", type=int, default=300, help="frames per size and codec (default: %(default)s)")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--turbojpeg-lib", default=None, help="libturbojpeg.so for PyTurboJPEG (default: its search)")
    a = p.parse_args(argv)
    frames = {(h, w): [scene(h, w, i) for i in range(a.frames)] for h, w in SIZES}
    makers = {"simplejpeg": simplejpeg_codec, "pyturbojpeg": lambda: turbojpeg_codec(a.turbojpeg_lib),
              "pillow": pillow_codec, "opencv": opencv_codec}
    codecs, unavailable, versions = {}, {}, {}
    for name, make in makers.items():
        try:
            codecs[name] = make()
        except Exception as exc:  # not installed, or its native library missing: reported, not fatal
            unavailable[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    for module, dist in (("simplejpeg", "simplejpeg"), ("turbojpeg", "PyTurboJPEG"), ("PIL", "pillow"),
                         ("cv2", "opencv")):
        with contextlib.suppress(Exception):  # not installed
            versions[dist] = __import__(module).__version__
    reference = {}
    if "simplejpeg" in codecs:
        reference = {size: codecs["simplejpeg"][1] for size in SIZES}
    rows = []
    for name, codec in codecs.items():
        rows += measure(name, codec, frames, a.quality, reference if name != "simplejpeg" else {})
    result = {"machine": machine(cpus=os.cpu_count(), load=list(os.getloadavg()), numpy=np.__version__),
              "versions": versions, "frames": a.frames, "results": rows, "unavailable": unavailable}
    report(a.json, result, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
