"""RLDS in: ``import_rlds`` (no TensorFlow) next to tensorflow-datasets reading the same shards.

Needs TensorFlow and tensorflow-datasets, so run it from the venv of
``tests/formats/tfds_venv.sh`` (torchstore is installed there editable)::

    bash tests/formats/tfds_venv.sh
    /tmp/tfds/bin/python benchmarks/formats_rlds.py [--episodes 200] [--steps 100]
        [--side 128] [--shards 8] [--repeat 3] [--data DIR] [--quick]

The dataset is written once with tfds's own writer (``tfds.dataset_builders.
store_as_tfds_dataset``, as tests/formats/make_rlds_fixture.py does), Open X-Embodiment
shaped: ``--episodes`` episodes of about ``--steps`` steps (80% to 120%), each step a
``--side`` x ``--side`` JPEG camera, float32 state[8], float64 joints[3], a zlib int32[2, 3]
tensor, float32 action[7], reward, discount, three flags, a language instruction and a
float32 embedding[4]. With ``--data`` it is kept there and reused.

Timed in turn (A B C A B C ...), medians over ``--repeat`` rounds, all over the same
shards, every library already imported (a process that has run each once):

- ``import_rlds``: the whole import, two passes (the strings, then the steps: every JPEG
  checked and kept as it is) and the HDF5 write with its checksums, into a new store;
  then, untimed, the store's size over the shards', and with ``images="decode"``;
- tfds, per episode: ``builder_from_directory(...).as_dataset()`` with ``tfds.as_numpy``,
  every episode and every step of its ``steps`` dataset drained to numpy (images
  decoded), as RLDS readers do;
- tfds, flat: the same full read with ``flat_map`` over the steps, ``batch(256)`` and
  ``prefetch``, tfds's fastest idiom here (decode only: nothing written).

The ratios are medians of the per-round ratios (a slow spell of a shared machine hits
every case of a round alike). Target: ``import_rlds`` at least as fast as tfds's flat
read (ratio >= 1x).

Then fresh processes, alternating, ``--repeat`` of each: the seconds a first call takes
when nothing is imported yet (``import_rlds``: torch, tensordict and h5py are imported
lazily inside it; tfds: ``import tensorflow_datasets`` is timed apart), and a second call
in the same process. Then cold, what a user of the command line waits for: the command
``torchstore import VERSION_FOLDER DEST`` as typed (a fresh interpreter: its start-up,
every import, the format sniffed, the import, the exit) against a fresh interpreter that
imports tensorflow_datasets and does one flat read, per-round ratios as above. The last
line quotes the two ratios the docs quote, warm in-process and the command cold, each
against the 1x target. Then peak RSS
(``VmHWM`` of a fresh process for each) of ``import_rlds`` and of tfds's flat read over
one shard and over ten (the one shard's records ten times over, listed in an edited
``dataset_info.json``): flat memory means the two are close. No timing is asserted
anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCHSTORE_DISABLE_PROGRESS", "1")

from _timing import per_call_interleaved, print_table, ratio_spread  # noqa: E402

from torchstore.formats import import_rlds  # noqa: E402


def make_dataset(folder: Path, episodes: int, steps: int, side: int, shards: int) -> Path:
    """The version folder of a tfds-written dataset (reused when already there)."""
    marker = folder / "made.json"
    wanted = {"episodes": episodes, "steps": steps, "side": side, "shards": shards}
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return Path(json.loads((folder / "where.json").read_text()))
    shutil.rmtree(folder, ignore_errors=True)
    from tests.formats.make_rlds_fixture import write_dataset

    rng = np.random.default_rng(0)
    lengths = rng.integers(int(steps * 0.8), int(steps * 1.2) + 1, episodes).tolist()
    started = time.perf_counter()
    version = write_dataset(
        folder / "data", lengths=lengths, image=(side, side, 3), wrist=None, shards=shards
    )
    print(f"wrote the dataset with tfds in {time.perf_counter() - started:.0f} s: {version}")
    (folder / "where.json").write_text(json.dumps(str(version)))
    marker.write_text(json.dumps(wanted))
    return version


def tfds_per_episode(version: Path) -> int:
    import tensorflow_datasets as tfds

    ds = tfds.builder_from_directory(str(version)).as_dataset(split="train", shuffle_files=False)
    n = 0
    for episode in tfds.as_numpy(ds):
        for step in episode["steps"]:
            n += step["observation"]["image"].shape[0] > 0
    return n


def tfds_flat(version: Path) -> int:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    ds = tfds.builder_from_directory(str(version)).as_dataset(split="train", shuffle_files=False)
    ds = ds.flat_map(lambda e: e["steps"]).batch(256).prefetch(tf.data.AUTOTUNE)
    n = 0
    for batch in tfds.as_numpy(ds):
        n += len(batch["observation"]["image"])
    return n


def replicate(version: Path, target: Path, times: int) -> Path:
    """A copy of ``version`` whose split is its first shard ``times`` over (hard links)."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    info = json.loads((version / "dataset_info.json").read_text())
    split = next(s for s in info["splits"] if s["name"] == "train")
    name = info["name"]
    first = version / f"{name}-train.tfrecord-00000-of-{len(split['shardLengths']):05d}"
    for i in range(times):
        os.link(first, target / f"{name}-train.tfrecord-{i:05d}-of-{times:05d}")
    split["shardLengths"] = [split["shardLengths"][0]] * times
    split.pop("numBytes", None)
    (target / "dataset_info.json").write_text(json.dumps(info))
    shutil.copy(version / "features.json", target / "features.json")
    return target


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM, which starts afresh at exec (``ru_maxrss`` does not:
    a child started from a parent holding TensorFlow would report the parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(who: str, source: str, dest: str, calls: int) -> None:
    """Run in a fresh process: ``calls`` reads (``import_rlds`` into ``dest``, or tfds's
    flat read), then print as JSON the seconds of the module imports (tfds's; ours happen
    inside the first call), of each call, and the peak RSS."""
    started = time.perf_counter()
    if who == "tfds":
        import tensorflow_datasets  # noqa: F401
    modules = time.perf_counter() - started
    seconds = []
    for _ in range(calls):
        Path(dest).unlink(missing_ok=True)
        started = time.perf_counter()
        if who == "tfds":
            tfds_flat(Path(source))
        else:
            import_rlds(source, dest, overwrite=True, progress=False)
        seconds.append(time.perf_counter() - started)
    Path(dest).unlink(missing_ok=True)
    print(json.dumps({"modules": modules, "calls": seconds, "rss_mb": peak_rss_mb()}))


def child_run(who: str, source: Path, dest: Path, calls: int = 1) -> dict:
    """:func:`child` in a fresh interpreter; ``wall``: the whole process, start to exit."""
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", who, str(source), str(dest), str(calls)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - started
    return result


def command_run(source: Path, dest: Path) -> float:
    """Seconds of ``torchstore import SOURCE DEST`` as a user types it, in a fresh process
    (the console script beside this interpreter, else ``python -m torchstore.cli``): the
    interpreter's start-up, its imports, the import and the exit."""
    dest.unlink(missing_ok=True)
    script = shutil.which("torchstore", path=str(Path(sys.executable).parent))
    argv = [script] if script else [sys.executable, "-m", "torchstore.cli"]
    started = time.perf_counter()
    subprocess.run([*argv, "import", str(source), str(dest)], check=True, capture_output=True)
    seconds = time.perf_counter() - started
    dest.unlink(missing_ok=True)
    return seconds


def setup_line(version: Path) -> str:
    """What the figures were measured on: CPUs, Python and the libraries' versions."""
    import platform

    import tensorflow as tf
    import tensorflow_datasets as tfds

    cpu = platform.processor() or platform.machine()
    for line in (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    ):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"tensorflow {tf.__version__}, tensorflow_datasets {tfds.__version__}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data", type=Path, default=None, help="keep (and reuse) the dataset here")
    p.add_argument("--quick", action="store_true", help="20 episodes, 1 repeat")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-RSS runs")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        who, source, dest, calls = a.child
        child(who, source, dest, int(calls))
        return
    if a.quick:
        a.episodes, a.repeat, a.shards = 20, 1, 2
    tmp = Path(tempfile.mkdtemp(prefix="rlds-bench-"))
    try:
        version = make_dataset(a.data or tmp / "ds", a.episodes, a.steps, a.side, a.shards)
        run(version, tmp, a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _met(ratio: float) -> str:
    return "met" if ratio >= 1.0 else "NO"


def run(version: Path, tmp: Path, a: argparse.Namespace) -> None:
    info = json.loads((version / "dataset_info.json").read_text())
    episodes = sum(int(n) for n in info["splits"][0]["shardLengths"])
    dest = tmp / "store.h5"
    steps = tfds_flat(version)
    size = sum(p.stat().st_size for p in version.glob("*.tfrecord-*")) / 2**20
    print(
        f"dataset: {episodes} episodes, {steps} steps, one {a.side}x{a.side} JPEG camera per "
        f"step (and state, action, flags, text),"
        f" {size:.0f} MiB of shards written by tfds's own writer"
    )
    print(f"setup: {setup_line(version)}")

    def ours() -> None:
        import_rlds(version, dest, progress=False)

    cases = [ours, lambda: tfds_per_episode(version), lambda: tfds_flat(version)]
    # the previous run's store is deleted untimed: freeing a GB-sized file is the
    # filesystem's work (0.3 s here), not the import's
    setups = [lambda: dest.unlink(missing_ok=True), None, None]
    samples = per_call_interleaved(cases, repeats=a.repeat, warmup=1, setups=setups)
    names = [
        "import_rlds (check frames + store write)",
        "tfds as_dataset, per episode",
        "tfds as_dataset, flat batch(256)",
    ]
    rows = []
    for name, times in zip(names, samples):
        t = statistics.median(times)
        per_episode = ratio_spread(samples[1], times)
        flat = ratio_spread(samples[2], times)
        rows.append(
            (
                name,
                f"{t:.2f}",
                f"{steps / t:,.0f}",
                f"{per_episode[0]:.2f}x ({per_episode[1]:.2f}-{per_episode[2]:.2f})",
                f"{flat[0]:.2f}x ({flat[1]:.2f}-{flat[2]:.2f})",
            )
        )
    print_table(
        f"warm, median of {a.repeat} alternating rounds (s); ratios: median (range) per round",
        ("case", "seconds", "steps/s", "tfds per-episode / this", "tfds flat / this"),
        rows,
    )
    # disk: the store next to the shards, frames kept as their JPEG bytes (the default)
    # and decoded to raw columns (images="decode")
    shards = sum(p.stat().st_size for p in version.glob("*.tfrecord-*"))
    kept = dest.stat().st_size
    import_rlds(version, tmp / "decoded.h5", progress=False, images="decode")
    decoded = (tmp / "decoded.h5").stat().st_size
    (tmp / "decoded.h5").unlink()
    print(
        f"disk: store / shards {kept / shards:.3f} with the JPEG bytes kept (default), "
        f"{decoded / shards:.2f} decoded (images='decode'); shards {shards / 2**20:.1f} MiB"
    )
    cold: dict[str, list[dict]] = {"import_rlds": [], "tfds flat": []}
    command: list[float] = []
    tfds_once: list[float] = []
    for _ in range(a.repeat):
        cold["import_rlds"].append(child_run("ours", version, tmp / "cold.h5", calls=2))
        cold["tfds flat"].append(child_run("tfds", version, tmp / "unused.h5", calls=2))
        command.append(command_run(version, tmp / "command.h5"))
        tfds_once.append(child_run("tfds", version, tmp / "unused.h5", calls=1)["wall"])
    print_table(
        f"a fresh process, median of {a.repeat} (s): modules imported first (tfds), a first "
        "call (import_rlds imports torch and h5py inside it), a second call",
        ("case", "modules", "first call", "second call", "whole process"),
        [
            (
                who,
                f"{statistics.median(r['modules'] for r in runs):.2f}",
                f"{statistics.median(r['calls'][0] for r in runs):.2f}",
                f"{statistics.median(r['calls'][1] for r in runs):.2f}",
                f"{statistics.median(r['wall'] for r in runs):.2f}",
            )
            for who, runs in cold.items()
        ],
    )
    cold_ratio = ratio_spread(tfds_once, command)
    # the command against a tfds read already warm in a process (medians: other rounds)
    against_warm = statistics.median(samples[2]) / statistics.median(command)
    print_table(
        f"cold: a fresh process each, start-up included, median of {a.repeat} (s); ratios: "
        "median (range) per round, and against tfds's warm flat read above",
        ("case", "seconds", "tfds cold / this", "tfds warm / this"),
        [
            (
                "torchstore import VERSION DEST (the command)",
                f"{statistics.median(command):.2f}",
                f"{cold_ratio[0]:.2f}x ({cold_ratio[1]:.2f}-{cold_ratio[2]:.2f})",
                f"{against_warm:.2f}x",
            ),
            (
                "python: import tensorflow_datasets, flat read",
                f"{statistics.median(tfds_once):.2f}",
                "1.00x",
                f"{statistics.median(samples[2]) / statistics.median(tfds_once):.2f}x",
            ),
        ],
    )
    warm = ratio_spread(samples[2], samples[0])
    print(
        f"\nimport_rlds against tfds's flat read: warm, in-process {warm[0]:.2f}x "
        f"(rounds {warm[1]:.2f}-{warm[2]:.2f}; target >= 1x: {_met(warm[0])}); the command "
        f"cold, interpreter start-up included, {cold_ratio[0]:.2f}x a cold tfds read "
        f"(rounds {cold_ratio[1]:.2f}-{cold_ratio[2]:.2f}; target >= 1x: {_met(cold_ratio[0])}), "
        f"{against_warm:.2f}x a warm one"
    )
    if a.no_memory:
        return
    one = replicate(version, tmp / "x1", 1)
    ten = replicate(version, tmp / "x10", 10)
    results = {
        (who, label): child_run(kind, folder, tmp / f"{label}.h5")
        for who, kind in (("import_rlds", "ours"), ("tfds flat", "tfds"))
        for label, folder in (("1x", one), ("10x", ten))
    }
    print_table(
        "peak RSS over 1x and 10x the shards (a fresh process each)",
        ("case", "shards", "seconds", "peak RSS MiB"),
        [
            (who, label, f"{r['calls'][0]:.1f}", f"{r['rss_mb']:.0f}")
            for (who, label), r in results.items()
        ],
    )


if __name__ == "__main__":
    main()
