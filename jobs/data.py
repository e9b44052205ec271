"""Datasets for the real jobs. Nothing downloads unless ``download=True`` is asked for.

- ``digits``: scikit-learn's 8x8 digits (1797 images, 10 classes), read straight from the CSV
  that ships inside the scikit-learn package, without importing sklearn (a slow import that
  every rank would pay).
- ``digits-aug``: the same, with a random augmentation of each training image, drawn in
  ``__getitem__`` (so in the DataLoader workers with ``--workers``) from torch's, Python's and
  NumPy's global generators, as transforms in the wild do (torchvision's draw from torch's,
  albumentations' from Python's and NumPy's); the test set is plain digits. For tests of exact
  resume with workers; ``jobs.train`` seeds each sample's draws (``drawn_generators``).
- ``cifar10`` / ``stl10`` / ``imagefolder`` / ``fake``: torchvision's own loaders. torchvision is
  imported only for these (a slow import, which every rank pays).
- ``verify=False`` skips torchvision's md5 checks for CIFAR10, for local copies and test sets
  whose files differ from the published ones. The file layout is still checked.
"""

from __future__ import annotations

import gzip
import importlib.util
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

NUM_CLASSES = {"digits": 10, "digits-aug": 10, "cifar10": 10, "stl10": 10, "fake": 10}


def _digits_csv() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits dataset ships with scikit-learn: pip install scikit-learn")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(_digits_csv(), "rt") as fh:
        data = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    return data[:, :-1].reshape(-1, 1, 8, 8) / 16.0, data[:, -1].astype(np.int64)


def digits(train: bool, test_fraction: float = 0.2, seed: int = 0) -> TensorDataset:
    """A fixed, seeded split so every rank (and every restart) sees the same sets."""
    x, y = load_digits_arrays()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    idx = order[n_test:] if train else order[:n_test]
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


class AugmentedDigits(Dataset):
    """Digits shifted by up to one pixel each way (across from torch's generator, down from Python's)
    plus a little Gaussian noise (NumPy's global generator): a new draw every time an image is read."""

    def __init__(self, base: TensorDataset, noise: float = 0.05) -> None:
        self.base, self.noise = base, noise

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[index]
        across, down = int(torch.randint(-1, 2, ())), random.randint(-1, 1)
        noise = torch.from_numpy(np.random.normal(0.0, self.noise, tuple(x.shape)).astype(np.float32))
        return torch.roll(x, shifts=(down, across), dims=(1, 2)) + noise, y


def _transform(image_size: int | None, channels: int = 3) -> Any:
    from torchvision import transforms

    steps: list[Any] = []
    if image_size:
        steps.append(transforms.Resize((image_size, image_size)))
    steps += [transforms.ToTensor(), transforms.Normalize([0.5] * channels, [0.5] * channels)]
    return transforms.Compose(steps)


def cifar10(root: str, train: bool, download: bool = False, verify: bool = True,
            image_size: int | None = None) -> Dataset:
    from torchvision.datasets import CIFAR10

    cls = CIFAR10 if verify else _unverified_cifar10()
    return cls(root, train=train, download=download, transform=_transform(image_size))


def _unverified_cifar10() -> type:
    from torchvision.datasets import CIFAR10

    class LocalCIFAR10(CIFAR10):
        """CIFAR10 without md5 checks: the files must exist, their content is not compared."""

        def _check_integrity(self) -> bool:
            base = Path(self.root) / self.base_folder
            names = [n for n, _ in self.train_list + self.test_list] + [self.meta["filename"]]
            return all((base / n).is_file() for n in names)

        def _load_meta(self) -> None:
            import pickle

            with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as fh:
                data = pickle.load(fh, encoding="latin1")
            self.classes = data[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return LocalCIFAR10


def stl10(root: str, train: bool, download: bool = False, image_size: int | None = None) -> Dataset:
    from torchvision.datasets import STL10

    return STL10(root, split="train" if train else "test", download=download, transform=_transform(image_size))


def imagefolder(root: str, train: bool, image_size: int | None = 64) -> Dataset:
    from torchvision.datasets import ImageFolder

    split = Path(root) / ("train" if train else "val")
    return ImageFolder(str(split if split.is_dir() else root), transform=_transform(image_size))


def fake(train: bool, size: int = 512, image_size: int = 32, num_classes: int = 10) -> Dataset:
    from torchvision.datasets import FakeData

    return FakeData(size=size if train else max(64, size // 4), image_size=(3, image_size, image_size),
                    num_classes=num_classes, transform=_transform(None), random_offset=0 if train else 10_000)


def build(name: str, train: bool, data_dir: str | None, download: bool, verify: bool,
          image_size: int | None, fake_size: int) -> Dataset:
    if name == "digits":
        return digits(train)
    if name == "digits-aug":
        return AugmentedDigits(digits(train)) if train else digits(train)
    if name == "fake":
        return fake(train, size=fake_size, image_size=image_size or 32)
    if data_dir is None:
        raise ValueError(f"dataset {name!r} needs --data-dir (nothing is downloaded unless --download)")
    if name == "cifar10":
        return cifar10(data_dir, train, download=download, verify=verify, image_size=image_size)
    if name == "stl10":
        return stl10(data_dir, train, download=download, image_size=image_size)
    if name == "imagefolder":
        return imagefolder(data_dir, train, image_size=image_size)
    raise ValueError(f"unknown dataset {name!r}: use digits, digits-aug, fake, cifar10, stl10 or imagefolder")


def drawn_generators(name: str) -> tuple[str, ...]:
    """The global generators that the training set of ``name`` draws from in ``__getitem__`` (its
    random augmentations): ``jobs.train`` seeds those per sample (``jobs.rng.SeededDataset``), so
    a resume with DataLoader workers is exact. Empty for the datasets that draw nothing, which
    pay nothing. A dataset given a random transform must be named here."""
    return ("torch", "random", "numpy") if name == "digits-aug" else ()


def num_classes(name: str, dataset: Dataset) -> int:
    classes = getattr(dataset, "classes", None)
    return len(classes) if classes else NUM_CLASSES.get(name, 10)


def in_channels(name: str) -> int:
    return 1 if name in ("digits", "digits-aug") else 3
