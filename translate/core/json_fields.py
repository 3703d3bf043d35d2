"""The JSON files of a run as typed dataclasses: a class's fields are the keys of the object it
reads and writes, so that no other module reads such a file by string keys.

- A field whose default is None is a part a file may lack: left out while it is None. A field
  without a default is a key the file must have (its value may still be null).
- Fields that are JsonObjects, or lists or dicts of them, are read and written as such.
- A class may name a REST field (a dict) that takes the keys it does not name, written after
  its own; without one, such keys are left out.
- An object read and written again keeps its keys in the order read; keys new to it follow, in
  the order of the class. So a file is written as a dict updated in place would be.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, ClassVar, Dict, Tuple, Type, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T", bound="JsonObject")


class FieldError(ValueError):
    """A JSON object that lacks a key its class needs, or holds a value of the wrong kind."""


class JsonObject:
    """Base of a dataclass read from and written to one JSON object (see the module's rules)."""

    REST: ClassVar[str] = ""  # the dict field that keeps the keys the class does not name
    _read_order: Tuple[str, ...] = ()  # the keys of the object it was read from, in order

    @classmethod
    def from_json(cls: Type[T], raw: Any, where: str = "") -> T:
        """The object of a parsed JSON value; FieldError names the first key that does not fit."""
        if not isinstance(raw, dict):
            raise FieldError(f"{where.rstrip('.') or 'the file'} is not a JSON object")
        kinds, named = get_type_hints(cls), {item.name for item in fields(cls)}
        values: Dict[str, Any] = {}
        for item in fields(cls):
            if item.name == cls.REST:
                continue
            if item.name in raw:
                values[item.name] = _decode(kinds[item.name], raw[item.name], f"{where}{item.name}")
            elif item.default is MISSING and item.default_factory is MISSING:
                raise FieldError(f"no {where}{item.name}")
        if cls.REST:
            values[cls.REST] = {key: value for key, value in raw.items() if key not in named}
        read = cls(**values)
        read._read_order = tuple(raw)
        return read

    def to_json(self) -> Dict[str, Any]:
        """The JSON object, keys in the order read, then the class's."""
        written: Dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name != self.REST and not (value is None and item.default is None):
                written[item.name] = _encode(value)
        if self.REST:
            written.update(_encode(getattr(self, self.REST)))
        first = [key for key in self._read_order if key in written]
        return {key: written[key] for key in first + [key for key in written if key not in first]}


def _decode(kind: Any, value: Any, where: str) -> Any:
    origin, arguments = get_origin(kind), get_args(kind)
    if origin is Union:  # Optional[X]
        if value is None:
            return None
        kind = next(argument for argument in arguments if argument is not type(None))
        origin, arguments = get_origin(kind), get_args(kind)
    if isinstance(kind, type) and issubclass(kind, JsonObject):
        return kind.from_json(value, f"{where}.")
    expected = {list: list, dict: dict, int: int, float: (int, float), str: str}.get(origin or kind)
    if expected is not None and (not isinstance(value, expected) or isinstance(value, bool) and kind is not bool):
        raise FieldError(f"{where} is not {_KIND_NAMES[origin or kind]}")
    element = arguments[-1] if arguments else None
    if isinstance(element, type) and issubclass(element, JsonObject):
        if origin is list:
            return [element.from_json(item, f"{where}[{i}].") for i, item in enumerate(value)]
        return {key: element.from_json(item, f"{where}.{key}.") for key, item in value.items()}
    return value


_KIND_NAMES = {list: "a list", dict: "an object", int: "a whole number", float: "a number", str: "a string"}


def _encode(value: Any) -> Any:
    if isinstance(value, JsonObject):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value

