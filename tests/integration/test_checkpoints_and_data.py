"""Atomic checkpoints under kill -9, the module. prefix, and torchvision's CIFAR10 loader offline."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from jobs import checkpoint as ckpt

WRITER = """
import sys, torch
from jobs.checkpoint import save_atomic, checkpoint_path
d = sys.argv[1]
save_atomic({"step": 1, "w": torch.ones(4)}, checkpoint_path(d, 1))
print("first", flush=True)
big = torch.randn(60_000_000)  # ~240 MB: the write takes long enough to be killed mid-way
while True:
    save_atomic({"step": 2, "w": big}, checkpoint_path(d, 2))
"""


def test_kill_9_during_write_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "first"
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):  # a write is under way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None
    state = ckpt.load_checkpoint(latest)  # whichever is latest, it is complete
    assert state["step"] in (1, 2)
    assert ckpt.list_checkpoints(tmp_path)[0].name == "ckpt-0000000001.pt"
    assert torch.equal(ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path)[0])["w"], torch.ones(4))
    # The killed write left its model-sized temporary file; the next write (rank 0, on resume) removes it.
    orphans = ckpt.orphaned_temporaries(tmp_path)
    assert orphans and orphans[0].name.startswith(".ckpt-0000000002.pt.")
    ckpt.save_checkpoint({"step": 3}, tmp_path, 3, keep=3, is_main=True, barrier=lambda: None)
    assert not list(tmp_path.glob("*.tmp")), list(tmp_path.iterdir())
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))["step"] == 3


def test_only_rank_0_writes_and_everyone_waits_for_the_file(tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []
    path = ckpt.checkpoint_path(tmp_path, 7)
    for is_main in (True, False):
        got = ckpt.save_checkpoint({"step": 7}, tmp_path / ("main" if is_main else "other"), 7, keep=2,
                                   is_main=is_main, barrier=lambda m=is_main: seen.append((str(m), True)))
        assert got.exists() == is_main
    assert seen == [("True", True), ("False", True)]  # the barrier runs on every rank
    order: list[str] = []
    ckpt.save_checkpoint({"step": 7}, tmp_path, 7, keep=2, is_main=True,
                         barrier=lambda: order.append("barrier:" + str(path.exists())))
    assert order == ["barrier:True"], "rank 0 must meet the others only once the checkpoint is complete"


def test_orphans_of_other_names_are_kept(tmp_path: Path) -> None:
    (tmp_path / ".ckpt-0000000005.pt.123.tmp").write_bytes(b"x")
    (tmp_path / "notes.tmp").write_bytes(b"keep")  # not ours
    assert [p.name for p in ckpt.prune_orphans(tmp_path)] == [".ckpt-0000000005.pt.123.tmp"]
    assert (tmp_path / "notes.tmp").exists()


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    for step in range(1, 6):
        ckpt.save_checkpoint({"step": step}, tmp_path, step, keep=2, is_main=True, barrier=lambda: None)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["ckpt-0000000004.pt", "ckpt-0000000005.pt"]


def test_state_dicts_load_with_or_without_module_prefix() -> None:
    from jobs.models import SmallCNN

    src = SmallCNN(1, 10)
    prefixed = {f"module.{k}": v for k, v in src.state_dict().items()}
    for state in (src.state_dict(), prefixed):
        dst = SmallCNN(1, 10)
        ckpt.load_model_state(dst, state)
        assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    wrapped = torch.nn.DataParallel(SmallCNN(1, 10))
    ckpt.load_model_state(wrapped, prefixed)
    assert list(ckpt.unwrapped_state(wrapped))[0].startswith("features")


def _write_tiny_cifar(root: Path, n: int = 20) -> None:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": list(rng.integers(0, 10, n))}
        (base / name).write_bytes(pickle.dumps(batch))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))


def test_cifar10_loader_on_tiny_local_copy(tmp_path: Path) -> None:
    from jobs import data

    _write_tiny_cifar(tmp_path)
    train = data.cifar10(str(tmp_path), train=True, verify=False)
    test = data.cifar10(str(tmp_path), train=False, verify=False)
    assert len(train) == 100 and len(test) == 20
    x, y = train[0]
    assert tuple(x.shape) == (3, 32, 32) and 0 <= y < 10
    with pytest.raises(RuntimeError):  # torchvision's md5 check refuses files that are not the real ones
        data.cifar10(str(tmp_path), train=True, verify=True)


def test_digits_ship_with_the_package() -> None:
    from jobs import data

    train, test = data.digits(True), data.digits(False)
    assert len(train) + len(test) == 1797
    assert tuple(train[0][0].shape) == (1, 8, 8)


def test_balanced_dataparallel_chunks() -> None:
    from jobs.parallel import balanced_chunks

    assert balanced_chunks(64, 4, None) == [16, 16, 16, 16]
    assert balanced_chunks(64, 4, 10) == [10, 18, 18, 18]
    assert sum(balanced_chunks(65, 3, 5)) == 65


def test_imagefolder_loader_on_images_written_here(tmp_path: Path) -> None:
    from PIL import Image

    from jobs import data

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / cls / f"{i}.png")
    train = data.imagefolder(str(tmp_path), train=True, image_size=16)
    val = data.imagefolder(str(tmp_path), train=False, image_size=16)
    assert len(train) == 6 and len(val) == 6 and train.classes == ["cat", "dog"]
    x, y = train[0]
    assert tuple(x.shape) == (3, 16, 16) and y in (0, 1)
    assert data.num_classes("imagefolder", train) == 2


def _augmented(workers: int, start: int = 0, persistent: bool = False, context: str | None = None,
               seeded: bool = True) -> dict[int, torch.Tensor]:
    """Epochs 0 and 1 of 96 augmented digits in a fixed order, from ``start`` on, as a DataLoader
    with ``workers`` produces them."""
    from torch.utils.data import DataLoader

    from jobs import data
    from jobs.rng import SeededDataset

    base = data.AugmentedDigits(data.digits(True))
    dataset = SeededDataset(base, seed=7) if seeded else base
    loader = DataLoader(dataset, batch_size=8, sampler=list(range(96))[start:], num_workers=workers,
                        persistent_workers=persistent, multiprocessing_context=context)
    out = {}
    for epoch in (0, 1):
        if seeded:
            dataset.set_epoch(epoch)
        torch.manual_seed(epoch)  # the workers' seeds differ epoch by epoch, as in jobs.train
        out[epoch] = torch.cat([x for x, _ in loader])
    return out


def test_seeded_augmentations_are_the_same_in_any_worker_after_any_resume() -> None:
    """What a resume mid-epoch with DataLoader workers does: the workers restart and the skipped
    samples shift every later one to another worker, at another place in its random stream."""
    whole = _augmented(workers=0)
    assert not torch.equal(whole[0], whole[1]), "every epoch draws new augmentations"
    for workers, start, persistent, context in [(2, 0, False, None), (2, 24, False, None), (2, 24, True, None),
                                                (1, 8, True, "spawn")]:
        # persistent: the workers are not re-created each epoch, and still see set_epoch
        got = _augmented(workers, start, persistent, context)
        for epoch in (0, 1):
            assert torch.equal(got[epoch], whole[epoch][start:]), (workers, start, persistent, context, epoch)
    # Unseeded, the same resume draws other augmentations: the bug the wrapper fixes.
    plain = _augmented(workers=2, seeded=False), _augmented(workers=2, start=24, seeded=False)
    assert not torch.equal(plain[0][0][24:], plain[1][0])


def test_seeded_dataset_in_the_training_process_leaves_its_streams_to_it() -> None:
    import random

    from jobs import data
    from jobs.rng import SeededDataset

    dataset = SeededDataset(data.AugmentedDigits(data.digits(True)), seed=7)
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    first = dataset[5][0]
    after = torch.rand(3), random.random(), np.random.rand()
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    assert not torch.equal(dataset[6][0], first)  # another sample, other draws ...
    assert torch.equal(torch.rand(3), after[0]), "torch's generator is left as it was found"
    assert (random.random(), np.random.rand()) == after[1:], "Python's and NumPy's move on, whatever the sample"
    assert torch.equal(dataset[5][0], dataset[5][0])
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after[0])
    dataset.set_epoch(1)
    assert not torch.equal(dataset[5][0], first)
    with pytest.raises(ValueError, match="unknown generator.*cuda.*name some of torch, random, numpy"):
        SeededDataset(dataset, generators=("torch", "cuda"))
