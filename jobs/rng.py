"""Seeding, and the RNG state a checkpoint carries so that a resumed run draws what an
uninterrupted one would have drawn (shuffles, dropout, augmentation); ``SeededDataset`` for the
draws made in DataLoader workers, whose state no checkpoint holds."""

from __future__ import annotations

import operator
import random
from typing import Any, Sequence

import torch
from torch.utils.data import Dataset, get_worker_info


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's generators."""
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's generator states, to be restored with ``set_rng_state``."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np = _numpy()
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


GENERATORS = ("torch", "random", "numpy")
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed that depends only on (seed, epoch, index): splitmix64 over the three values
    (a few integer operations, about 1 us; Python's ``hash`` of a tuple may change between versions)."""
    h = 0
    for value in (seed, epoch, index):
        h = _splitmix64((h ^ (value & _MASK64)) + _GOLDEN & _MASK64)
    return h


def _splitmix64(z: int) -> int:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


class SeededDataset(Dataset):
    """A dataset whose random draws for a sample depend only on (seed, epoch, sample index).

    When to use it: your training set's ``__getitem__`` draws random numbers (random
    augmentations), you load it with DataLoader workers (``num_workers > 0``), and a resumed run
    must draw what an uninterrupted one would have drawn. A worker's generators are seeded once
    per epoch and then run on, so a sample's draws depend on which worker reads it and on how many
    samples that worker read before; a resume mid-epoch restarts the workers on fewer samples, so
    it draws other augmentations, and no checkpoint holds a worker's generators. Wrapped, each
    ``__getitem__`` first seeds the generators from (seed, epoch, index): the same draws whatever
    the worker, the number of workers (0 included), the world size or the resume. Not needed for a
    dataset that draws nothing, nor without workers, where the checkpoint's RNG state already
    makes a resume exact.

    Call ``set_epoch(epoch)`` every epoch before iterating, as for DistributedSampler (else every
    epoch draws the same augmentations). The epoch lives in shared memory, so workers see it
    whether they are made anew every epoch or kept (``persistent_workers``), forked or spawned.

    ``generators`` names the global generators to seed: torch's CPU generator, Python's ``random``
    and NumPy's legacy global one (``np.random.*``). A worker pays about 10 us a sample for all
    three, 3 us for torch's alone: name only those your transforms draw from. Not covered: draws
    outside ``__getitem__`` (``collate_fn``, ``worker_init_fn``), from generator objects of your own
    (``torch.Generator``, ``np.random.default_rng``), and CUDA's. An index read twice in one epoch
    (DistributedSampler's padding) draws the same twice. In the training process (no workers)
    torch's generator is left as it was found, and Python's and NumPy's are reseeded from one draw
    of their own (restoring NumPy's state would cost 100 us), so the training loop's own streams
    never depend on the samples; that costs about 30 us a sample.
    """

    def __init__(self, dataset: Dataset, seed: int = 0, generators: Sequence[str] = GENERATORS) -> None:
        unknown = sorted(set(generators) - set(GENERATORS))
        if unknown:
            raise ValueError(f"SeededDataset: unknown generator(s) {', '.join(unknown)}; name some of "
                             f"{', '.join(GENERATORS)}")
        self.dataset, self.seed = dataset, int(seed)
        self._torch, self._random = "torch" in generators, "random" in generators
        self._numpy = "numpy" in generators and _numpy() is not None  # a flag: a module does not pickle (spawn)
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()  # seen by persistent workers too

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        seed = sample_seed(self.seed, self._epoch.item(), operator.index(index))
        if get_worker_info() is not None:  # a worker: its generators serve the dataset alone
            self._seed(seed)
            return self.dataset[index]
        torch_state = torch.default_generator.get_state() if self._torch else None
        py_next = random.getrandbits(64) if self._random else None
        np_next = _numpy().random.randint(1 << 32) if self._numpy else None
        try:
            self._seed(seed)
            return self.dataset[index]
        finally:
            if torch_state is not None:
                torch.default_generator.set_state(torch_state)
            if py_next is not None:
                random.seed(py_next)
            if np_next is not None:
                _numpy().random.seed(np_next)

    def _seed(self, seed: int) -> None:
        if self._torch:
            torch.default_generator.manual_seed(seed)  # torch.manual_seed would also seed CUDA's: 100x slower
        if self._random:
            random.seed(seed)
        if self._numpy:
            _numpy().random.seed(seed >> 32)  # the legacy generator takes 32 bits
