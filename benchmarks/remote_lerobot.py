"""Training samples from the Hub, side by side: lerobot's ``StreamingLeRobotDataset`` against a
windowed torchstore store opened from ``hf://``, on the same data behind the same slow link.

Builds, in a scratch folder, a low-dim LeRobot v3.0 dataset (``--episodes`` episodes of
``--min-len`` to ``--max-len`` frames, uniform; ``observation.state`` float32[17],
``action`` float32[6], 30 fps, one task; with ``--camera HxW`` a camera too,
``observation.images.cam``, a photograph panned by a moving camera as in
``benchmarks/cameras.py``, AV1 MP4 at LeRobot's settings) with torchstore's
``LeRobotWriter`` at LeRobot's default file sizes, and imports it into a store with
``import_lerobot`` (the camera kept as its AV1 packets: the window decodes them). Both are published
on the tests' loopback Hub (``tests/hubserver.py``): the dataset with its ``v3.0`` tag, the
store as one file. Then ``--latency-ms`` is added to every request and each answer's body
is capped at ``--mbps`` MB/s, and, in one run:

- lerobot: ``StreamingLeRobotDataset(repo_id)`` at its defaults (``HF_ENDPOINT`` at the
  loopback Hub, a fresh ``HF_HOME``) in a torch ``DataLoader`` (``--batch``,
  ``num_workers`` = the cores), ``--repeats`` samples of ``--batches`` batches each from one
  stream after the ``2 * workers + 1`` batches its workers prefetched while starting;
- torchstore: ``WindowStorage(hf://datasets/.../lowdim.h5)`` + ``WindowSampler``
  (``--fraction`` of the store's rows resident in ``--blocks`` blocks), the same batches,
  cold (a fresh range cache, the store opened anew) and then warm (the cache kept),
  ``--our-repeats`` each (a low-dim sample of ``--batches`` takes a fraction of a second),
  every repeat with a seed of its own.

Prints one table: time to the first batch, samples/s (median) and the ratio to lerobot's,
requests the Hub answered and bytes it sent, and the spread of the draws over episodes in
the first timed sample of each loader: episodes drawn, the coefficient of variation of each
episode's draws over its expected share (draws / (n * length / rows)) and the chi-square
statistic against those expected counts over its degrees of freedom, beside the same two
for ``n`` i.i.d. uniform draws over the rows (about 0 and 1 for a uniform sampler).

lerobot 0.6 needs Python 3.12, so its side runs as a script under ``--lerobot-python``
(default ``/tmp/lr06/bin/python``, made by ``bash tests/lerobot/lerobot_venv.sh 0.6.1
/tmp/lr06``), after the torchstore side; without that interpreter the table says so and
has the torchstore rows only.

Usage: python benchmarks/remote_lerobot.py [--episodes 300] [--min-len 50] [--max-len 400]
       [--latency-ms 20] [--mbps 200] [--batch 256] [--batches 100] [--repeats 3]
       [--our-repeats 7] [--camera HxW]
       [--fraction 0.1] [--blocks 4] [--data-file-mb 100] [--lerobot-python PATH]
       [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _camera_frames import camera_frames  # noqa: E402
from _timing import print_table  # noqa: E402

from tests.hubserver import HubServer  # noqa: E402
from torchstore.lerobot import LeRobotWriter, import_lerobot  # noqa: E402
from torchstore.lerobot.hub import push_to_hub  # noqa: E402
from torchstore.window.window_storage import WindowSampler, WindowStorage  # noqa: E402

FPS = 30
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [17], "names": None},
    "action": {"dtype": "float32", "shape": [6], "names": None},
}
CAMERA = "observation.images.cam"
DATASET_REPO = "bench/lowdim"
STORE_REPO = "bench/lowdim_store"
STORE_PATH = "data/lowdim.h5"
DEFAULT_LEROBOT_PYTHON = "/tmp/lr06/bin/python"
LEROBOT_VENV_HINT = "bash tests/lerobot/lerobot_venv.sh 0.6.1 /tmp/lr06"

#: the lerobot side, run by the lerobot interpreter: prints one JSON line
LEROBOT_SCRIPT = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

repo_id = sys.argv[1]
batch, workers, warmup, steps, repeats = map(int, sys.argv[2:7])
torch.set_num_threads(1)
t0 = time.perf_counter()
dataset = StreamingLeRobotDataset(repo_id)
loader = DataLoader(dataset, batch_size=batch, num_workers=workers,
                    persistent_workers=workers > 0, drop_last=True)


def forever():
    while True:
        yield from loader


batches = forever()
for _ in range(warmup):
    next(batches)
first = time.perf_counter() - t0
rates, episodes = [], []
for r in range(repeats):
    drawn = []
    t = time.perf_counter()
    for _ in range(steps):
        drawn.append(next(batches)["episode_index"])
    rates.append(steps * batch / (time.perf_counter() - t))
    if r == 0:
        episodes = torch.cat(drawn).tolist()
print(json.dumps({"first_s": first, "rates": rates, "episodes": episodes,
                  "shards": dataset.num_shards, "frames": dataset.num_frames}))
"""


def cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------- the data
def build(work: Path, args) -> tuple[Path, Path, np.ndarray]:
    """The LeRobot dataset, the store imported from it, and the episode lengths."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.min_len, args.max_len + 1, args.episodes)
    root, store = work / "lerobot", work / "lowdim.h5"
    features = dict(FEATURES)
    if args.camera:
        names = ["height", "width", "channels"]
        features[CAMERA] = {"dtype": "video", "shape": [*args.camera, 3], "names": names}
    with LeRobotWriter(
        root, fps=FPS, features=features, checkpoints=False,
        data_files_size_in_mb=args.data_file_mb,
    ) as writer:  # fmt: skip
        for episode, n in enumerate(lengths):
            rows = {
                name: rng.standard_normal((int(n), *spec["shape"]), dtype=np.float32)
                for name, spec in FEATURES.items()
            }
            if args.camera:
                rows[CAMERA] = camera_frames(int(n), *args.camera, episode=episode)
            writer.add_episode(rows, task="reach")
    import_lerobot(root, store, progress=False)
    return root, store, lengths


def publish(hub: HubServer, root: Path, store: Path) -> None:
    from huggingface_hub import HfApi

    push_to_hub(root, DATASET_REPO, endpoint=hub.endpoint, progress=False)
    api = HfApi(endpoint=hub.endpoint, token=False)
    api.create_repo(STORE_REPO, repo_type="dataset")
    api.upload_file(
        path_or_fileobj=str(store), path_in_repo=STORE_PATH, repo_id=STORE_REPO,
        repo_type="dataset",
    )  # fmt: skip


# ---------------------------------------------------------------- the spread
def spread(episodes: torch.Tensor, lengths: np.ndarray, batch: int) -> tuple[str, ...]:
    """How draws of ``episodes`` (in batches of ``batch``) spread over the episodes, where a
    uniform draw over rows gives episode ``e`` a share ``lengths[e] / rows``: episodes
    drawn, the median of distinct episodes a batch, the coefficient of variation of each
    episode's draws over its expected draws, and the chi-square statistic against the
    expected draws over its degrees of freedom.

    Examples:
        >>> lengths = np.array([2, 1, 1])  # every row drawn once: exactly the expected draws
        >>> spread(torch.tensor([0, 0, 1, 2]), lengths, 2)
        ('3/3', '1.5', '0.00', '0.0')
    """
    counts = torch.bincount(episodes, minlength=len(lengths)).double()
    expected = torch.as_tensor(lengths, dtype=torch.float64) * len(episodes) / lengths.sum()
    ratio = counts / expected
    chi2 = float(((counts - expected) ** 2 / expected).sum()) / max(1, len(lengths) - 1)
    per_batch = statistics.median(len(b.unique()) for b in episodes.split(batch))
    return (
        f"{int((counts > 0).sum())}/{len(lengths)}",
        f"{per_batch:g}",
        f"{float(ratio.std() / ratio.mean()):.2f}",
        f"{chi2:.1f}",
    )


def iid_episodes(n: int, lengths: np.ndarray, seed: int) -> torch.Tensor:
    """The episodes of ``n`` i.i.d. uniform draws over the rows."""
    rows = torch.randint(int(lengths.sum()), (n,), generator=torch.Generator().manual_seed(seed))
    return episode_of(rows, lengths)


def episode_of(rows: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    starts = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]), dtype=torch.int64)
    return torch.searchsorted(starts, rows, right=True) - 1


# ---------------------------------------------------------------- the two loaders
class Traffic:
    """What the Hub answered from the moment it was made: requests and resolve bytes."""

    def __init__(self, hub: HubServer):
        self.hub = hub
        self.first = len(hub.requests)
        self.bytes = sum(hub.body_bytes.values())

    def since(self) -> tuple[list[dict], int]:
        return self.hub.requests[self.first :], sum(self.hub.body_bytes.values()) - self.bytes


def camera_text(camera: tuple[int, int] | None) -> str:
    return f", a {camera[0]}x{camera[1]} AV1 camera" if camera else ""


def camera_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(x) for x in text.lower().split("x"))
    except ValueError:
        height = width = 0
    if height < 8 or width < 8:
        raise argparse.ArgumentTypeError(f"--camera ({text!r}) must be HxW, e.g. 96x128")
    return height, width


def torchstore_run(url: str, budget: int, blocks: int, batch: int, steps: int, seed: int):
    """Seconds to the first batch, samples/s over ``steps`` batches after it, the rows
    they drew."""
    t = time.perf_counter()
    storage = WindowStorage(url, resident=budget, resident_blocks=blocks, seed=seed)
    sampler = WindowSampler(storage, seed=seed)
    index, _ = sampler.sample(storage, batch)
    storage.get(index)
    first = time.perf_counter() - t
    drawn = []
    t = time.perf_counter()
    for _ in range(steps):
        index, _ = sampler.sample(storage, batch)
        storage.get(index)
        drawn.append(index)
    rate = steps * batch / (time.perf_counter() - t)
    storage.close()
    return first, rate, torch.cat(drawn)


def lerobot_run(python: str, endpoint: str, work: Path, args) -> dict | str:
    """lerobot's side from its own interpreter, or why it was skipped."""
    if not Path(python).exists():
        return f"skipped: lerobot 0.6 venv not found at {python} (make it: {LEROBOT_VENV_HINT})"
    script = work / "lerobot_side.py"
    script.write_text(LEROBOT_SCRIPT)
    workers = cores()
    warmup = 2 * workers + 1  # what the workers prefetch while starting
    home = work / "lerobot-home"
    shutil.rmtree(home, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_IMPLICIT_TOKEN="1", NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )  # fmt: skip
    libs = Path(python).parent.parent / "ffmpeg-libs"
    if libs.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
    cmd = [python, str(script), DATASET_REPO, str(args.batch), str(workers), str(warmup),
           str(args.batches), str(args.repeats)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return f"skipped: the lerobot side failed ({' '.join(tail)})"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["workers"], result["warmup"] = workers, warmup
    result["stopped_workers"] = "Too many dataloader workers" in done.stderr
    return result


def kinds(requests: list[dict]) -> str:
    """What the requests were: API calls, HEADs, GETs (ranged), and the paths refused."""
    api = sum(1 for r in requests if r["path"].startswith("/api/"))
    head = sum(1 for r in requests if r["method"] == "HEAD")
    get = sum(1 for r in requests if r["method"] == "GET" and not r["path"].startswith("/api/"))
    ranged = sum(1 for r in requests if r["range"])
    refused = sorted(
        {r["path"].split("/")[-1] for r in requests if (r["status"] or 0) >= 400}
    )  # fmt: skip
    return f"{api} API calls, {head} HEAD and {get} GET of files ({ranged} ranged)" + (
        f"; refused (404): {', '.join(refused)}" if refused else ""
    )


# ---------------------------------------------------------------- the run
def describe(traffic: tuple[list[dict], int]) -> tuple[int, int, int, str]:
    """Requests, of which ranged and answered 4xx/5xx, and the resolve MiB sent."""
    requests, sent = traffic
    failed = sum(1 for r in requests if (r["status"] or 0) >= 400)
    ranged = sum(1 for r in requests if r["range"])
    return len(requests), ranged, failed, f"{sent / 2**20:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--min-len", type=int, default=50)
    parser.add_argument("--max-len", type=int, default=400)
    parser.add_argument(
        "--data-file-mb", type=int, default=100,
        help="the LeRobot dataset's data file size cap (LeRobot's default: 100); a file is a "
        "shard of its stream",
    )  # fmt: skip
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=200.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=100, help="batches per timed sample")
    parser.add_argument("--repeats", type=int, default=3, help="timed samples of lerobot's")
    parser.add_argument(
        "--our-repeats", type=int, default=7,
        help="timed samples of each torchstore case (one is a fraction of a second)",
    )  # fmt: skip
    parser.add_argument("--fraction", type=float, default=0.1, help="of the store resident")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument(
        "--camera", type=camera_size, default=None,
        help="add an AV1 camera of HxW (e.g. 96x128) to the dataset",
    )  # fmt: skip
    parser.add_argument("--lerobot-python", default=DEFAULT_LEROBOT_PYTHON)
    parser.add_argument("--dir", default=None, help="where the scratch folder goes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n = args.batch * args.batches
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="torchstore-remote-lerobot-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        root, store, lengths = build(work, args)
        rows = int(lengths.sum())
        size = store.stat().st_size
        print(
            f"{args.episodes} episodes of {lengths.min()}-{lengths.max()} frames, {rows:,} rows "
            f"(state f32[17], action f32[6]{camera_text(args.camera)}); "
            f"store {size / 2**20:.1f} MiB, LeRobot dataset "
            f"{sum(p.stat().st_size for p in root.rglob('*') if p.is_file()) / 2**20:.1f} MiB; "
            f"built in {time.perf_counter() - t:.0f} s. {cores()} cores, load average "
            f"{os.getloadavg()[0]:.1f}; a timed sample is {args.batches} batches of "
            f"{args.batch} = {n:,} draws ({n / rows:.2f} of the rows)"
        )
        saved_env = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "TORCHSTORE_CACHE")}
        try:
            with HubServer() as hub:
                publish(hub, root, store)
                hub.delay_s, hub.rate_bytes_per_s = args.latency_ms / 1000, int(args.mbps * 1e6)
                os.environ["HF_ENDPOINT"] = hub.endpoint
                table, notes = run_both(hub, work, lengths, args)
        finally:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    print_table(
        f"samples from the loopback Hub ({args.latency_ms:g} ms a request, {args.mbps:g} MB/s "
        f"an answer; batch {args.batch}; samples/s: the median of {args.repeats} (lerobot) "
        f"and {args.our_repeats} (torchstore) x {n:,}; the spread over episodes: the first "
        f"{n:,} timed draws)",
        ("loader", "first batch s", "samples/s", "vs lerobot", "requests", "ranged", ">= 400",
         "MiB sent", "episodes drawn", "a batch", "CV draws/expected", "chi2/dof"),
        table,
    )  # fmt: skip
    for note in notes:
        print(f"\n{note}")
    return 0


def run_both(hub: HubServer, work: Path, lengths: np.ndarray, args) -> tuple[list, list[str]]:
    n = args.batch * args.batches
    url = f"hf://datasets/{STORE_REPO}/{STORE_PATH}"
    budget = max(args.blocks, int(lengths.sum() * args.fraction))  # rows
    ours: dict[str, list] = {}
    for case in ("cold", "warm"):
        for r in range(args.our_repeats):
            # repeat r's own cache: made by its cold run, read by its warm run (the same seed)
            os.environ["TORCHSTORE_CACHE"] = str(work / f"range-cache-{r}")
            traffic = Traffic(hub)
            first, rate, drawn = torchstore_run(
                url, budget, args.blocks, args.batch, args.batches, seed=r
            )
            ours.setdefault(case, []).append((first, rate, drawn, traffic.since()))
    traffic = Traffic(hub)
    theirs = lerobot_run(args.lerobot_python, hub.endpoint, work, args)
    their_traffic = traffic.since()
    notes = []
    table = []
    their_rate = None
    if isinstance(theirs, str):
        notes.append(f"lerobot: {theirs}")
    else:
        their_rate = statistics.median(theirs["rates"])
        table.append((
            f"lerobot StreamingLeRobotDataset, {theirs['workers']} workers",
            f"{theirs['first_s']:.1f}", f"{their_rate:,.0f}", "1.00x", *describe(their_traffic),
            *spread(torch.tensor(theirs["episodes"]), lengths, args.batch),
        ))  # fmt: skip
        notes.append(
            f"lerobot: {theirs['shards']} shard(s) (its data files)"
            + (
                f"; datasets stopped all but one of its {theirs['workers']} DataLoader workers "
                "('Too many dataloader workers': each worker is handed one-shard streams)"
                if theirs["stopped_workers"]
                else ""
            )
            + f"; {theirs['warmup']} batches drained before timing; the first batch took "
            f"{theirs['first_s']:.1f} s from construction (metadata download, data file "
            f"listing, its workers starting); its requests: {kinds(their_traffic[0])}"
        )
    for case, runs in ours.items():
        first = statistics.median(r[0] for r in runs)
        rate = statistics.median(r[1] for r in runs)
        vs = f"{rate / their_rate:,.1f}x" if their_rate else "-"
        requests = sorted(runs, key=lambda r: len(r[3][0]))[len(runs) // 2][3]
        table.append((
            f"torchstore WindowStorage from hf://, {case} cache", f"{first:.2f}", f"{rate:,.0f}",
            vs, *describe(requests), *spread(episode_of(runs[0][2], lengths), lengths, args.batch),
        ))  # fmt: skip
    table.append((
        "i.i.d. uniform over the rows, as many draws", *["-"] * 7,
        *spread(iid_episodes(n, lengths, 0), lengths, args.batch),
    ))  # fmt: skip
    notes.append(
        f"torchstore: {args.fraction:g} of the store's rows resident in {args.blocks} blocks, "
        "one "
        "process (the window's refill thread reads ahead), each repeat a seed of its own; "
        "requests and bytes are one repeat's (the median by requests)"
    )
    return table, notes


if __name__ == "__main__":
    sys.exit(main())
