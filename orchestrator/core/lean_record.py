"""Frozen records that cost nothing to define, for the modules a rank imports before its entrypoint.

``dataclasses`` writes and compiles each method of each class when its module is imported: about
0.5-1.4 ms a frozen class on this project's machine, after 6 ms to import ``dataclasses`` and
``inspect``. A rank imported 17 such classes before the user's code, and on a node where 64 ranks
share the cores (the 64-node start-up benchmark, docs/PERFORMANCE.md) every rank pays that again.
``record`` makes the same frozen class, built by keyword or position, compared and hashed by value,
from methods shared by every record: nothing is generated. Type checkers read it as a dataclass
(PEP 681's ``dataclass_transform``). No ``field()``: a default is a plain (immutable) value.
Standard library only, and no ``typing`` at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a rank imports this module)

if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:
    def dataclass_transform(**_options: object) -> object:
        return lambda decorated: decorated

_FIELDS = "__record_fields__"
_DEFAULTS = "__record_defaults__"


class FrozenRecordError(AttributeError):
    """A field of a record was assigned or deleted (as ``dataclasses.FrozenInstanceError``)."""


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    names: tuple[str, ...] = getattr(cls, _FIELDS)
    if len(args) > len(names):
        raise TypeError(f"{cls.__name__}() takes {len(names)} arguments but {len(args)} were given")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
        object.__setattr__(self, name, value)
    defaults: dict[str, Any] = getattr(cls, _DEFAULTS)
    for name in names[len(args):]:
        if name in kwargs:
            object.__setattr__(self, name, kwargs.pop(name))
        elif name in defaults:
            object.__setattr__(self, name, defaults[name])
        else:
            raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
    if kwargs:
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in getattr(type(self), _FIELDS))


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in getattr(type(self), _FIELDS))
    return f"{type(self).__qualname__}({shown})"


def _setattr(self: Any, name: str, value: object) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r} of a {type(self).__name__} (a frozen record: "
                            "make a changed copy with lean_record.replace)")


def _delattr(self: Any, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r} of a {type(self).__name__} (a frozen record)")


_METHODS = {"__init__": _init, "__eq__": _eq, "__hash__": _hash, "__repr__": _repr,
            "__setattr__": _setattr, "__delattr__": _delattr}


@dataclass_transform(frozen_default=True)
def record(cls: type[_T]) -> type[_T]:
    """A frozen record of ``cls``'s annotated fields, its bases' first (as ``@dataclass(frozen=True)``).
    A method the class defines itself (``__repr__``...) is kept."""
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for base in reversed(cls.__mro__[1:]):
        for name in getattr(base, _FIELDS, ()):
            if name not in names:
                names.append(name)
        defaults.update(getattr(base, _DEFAULTS, {}))
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        if name not in names:
            names.append(name)
        if name in cls.__dict__:
            defaults[name] = cls.__dict__[name]
        elif name in defaults:
            raise TypeError(f"{cls.__name__}.{name} needs a default: the field it overrides has one")
    after_default = False
    for name in names:
        if name in defaults:
            after_default = True
        elif after_default:
            raise TypeError(f"{cls.__name__}.{name}: a field without a default follows one with a default")
    setattr(cls, _FIELDS, tuple(names))
    setattr(cls, _DEFAULTS, defaults)
    for method, function in _METHODS.items():
        if method not in cls.__dict__ or (method == "__hash__" and cls.__dict__[method] is None):
            setattr(cls, method, function)
    return cls


def field_names(cls_or_record: Any) -> tuple[str, ...]:
    """The record's fields, in order."""
    return tuple(getattr(cls_or_record, _FIELDS))


def required_names(cls: type) -> tuple[str, ...]:
    """The fields without a default."""
    defaults = getattr(cls, _DEFAULTS)
    return tuple(name for name in getattr(cls, _FIELDS) if name not in defaults)


def is_record(value: object) -> bool:
    return hasattr(type(value), _FIELDS)


def replace(value: _T, **changes: Any) -> _T:
    """A copy of the record ``value`` with ``changes`` (as ``dataclasses.replace``)."""
    current = {name: getattr(value, name) for name in getattr(type(value), _FIELDS)}
    return type(value)(**{**current, **changes})


def as_dict(value: Any) -> Any:
    """The record as a dict, records inside it too (as ``dataclasses.asdict``)."""
    if is_record(value):
        return {name: as_dict(getattr(value, name)) for name in getattr(type(value), _FIELDS)}
    if type(value) in (list, tuple):
        return type(value)(as_dict(item) for item in value)
    if isinstance(value, dict):
        return {key: as_dict(item) for key, item in value.items()}
    return value
