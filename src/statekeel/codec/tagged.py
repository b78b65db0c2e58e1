"""One JSON codec for everything statekeel stores.

Plain JSON values pass through; a registry of types round-trips exactly (``datetime`` with its
``ZoneInfo`` zone if any, ``date``, ``time``, ``UUID``, ``Decimal``, ``bytes``, ``Enum`` members, dataclass
instances, integers beyond 64 bits, strings holding NUL, and the floats PostgreSQL's JSONB would change:
``-0.0`` and those of magnitude 1e16 or more). Tuples are stored as lists. Anything else — functions,
sets, NaN/±inf, non-string dict keys, arbitrary objects — raises
:class:`~statekeel.errors.SerializationError` naming the path of the bad value (``messages[3].content.foo``)
before anything is written.

Tagged values are objects with the reserved key ``"$sk"``; a user object that itself has that key is
escaped, so every JSON object the caller stores comes back unchanged.

    codec = Codec(max_record_bytes=1 << 20)
    raw = codec.encode({"at": datetime.now(UTC), "blob": b"\\x00\\x01"})
    assert codec.decode(raw)["blob"] == b"\\x00\\x01"
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import enum
import math
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import orjson

from ..errors import DecryptionError, PayloadTooLarge, SerializationError

if TYPE_CHECKING:
    from .encryption import Cipher

TAG = "$sk"
_TAG_BYTES = b'"$sk"'
DEFAULT_MAX_RECORD_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 100
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# PostgreSQL's JSONB keeps numbers as ``numeric``: a float written in exponent form (|x| >= 1e16) comes
# back as an integer, and -0.0 as 0.0. Such floats are tagged so they round-trip on every backend.
_FLOAT_EXACT = 1e16


def _plain_float(value: float) -> bool:
    """True if ``value`` survives a plain JSON number on every backend (NaN and infinities do not)."""
    if not -_FLOAT_EXACT < value < _FLOAT_EXACT:
        return False
    return value != 0.0 or math.copysign(1.0, value) > 0.0


Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]

# name -> (cls, encode, decode): user-registered types.
_custom_by_name: dict[str, tuple[type, Encoder, Decoder]] = {}
_custom_by_type: dict[type, str] = {}


def register_type(cls: type, name: str, encode: Encoder, decode: Decoder) -> None:
    """Teach the codec a type: ``encode(obj)`` must return a codec-encodable value, ``decode`` inverts it.

    Example::

        register_type(Point, "point", lambda p: [p.x, p.y], lambda v: Point(*v))
    """
    if not isinstance(name, str) or not name or name in _BUILTIN_TAGS:
        raise SerializationError(f"cannot register type under name {name!r}: empty or reserved")
    _custom_by_name[name] = (cls, encode, decode)
    _custom_by_type[cls] = name


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_class(ref: str) -> type:
    # Only classes of modules already imported: stored data never makes us import code.
    module_name, _, qual = ref.partition(":")
    obj: Any = sys.modules.get(module_name)
    if obj is None:
        raise SerializationError(
            f"stored value refers to class {ref!r} whose module is not imported; import {module_name} "
            "before loading",
            ref=ref,
        )
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise SerializationError(f"stored value refers to unknown class {ref!r}", ref=ref)
    if not isinstance(obj, type):
        raise SerializationError(f"stored value refers to {ref!r}, which is not a class", ref=ref)
    return obj


class _Bad(Exception):
    """Internal: carries the reason and the path of an unencodable value up the walk."""

    def __init__(self, reason: str, path: list[str | int]) -> None:
        self.reason = reason
        self.path = path


def format_path(path: list[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"


def _to_json(value: Any, depth: int, max_depth: int) -> Any:
    """Return ``value`` as plain JSON types, tagging registered types. Raises _Bad with a reversed path."""
    t = type(value)
    if t is str:
        if "\x00" in value:
            return {TAG: "nulstr", "v": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()}
        return value
    if t is bool or value is None:
        return value
    if t is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        return {TAG: "int", "v": str(value)}
    if t is float:
        if _plain_float(value):
            return value
        if math.isfinite(value):
            return {TAG: "float", "v": repr(value)}
        raise _Bad(f"float {value!r} is not valid JSON (NaN and infinities are refused)", [])
    if depth >= max_depth:
        raise _Bad(f"nesting deeper than {max_depth} levels", [])
    if t is dict:
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise _Bad(f"dict key {k!r} is a {type(k).__name__}; keys must be str", [])
            if "\x00" in k:
                raise _Bad(f"dict key {k!r} contains NUL", [])
            try:
                out[k] = _to_json(v, depth + 1, max_depth)
            except _Bad as bad:
                bad.path.append(k)
                raise
        if TAG in out:
            return {TAG: "dict", "v": out}
        return out
    if t is list or t is tuple:
        items = []
        for i, v in enumerate(value):
            try:
                items.append(_to_json(v, depth + 1, max_depth))
            except _Bad as bad:
                bad.path.append(i)
                raise
        return items
    return _to_json_special(value, depth, max_depth)


def _is_plain(value: Any, max_depth: int) -> bool:
    """True if ``value`` is already plain JSON that :func:`_to_json` would return unchanged.

    Checking is cheaper than rebuilding: most records (messages, metadata) are plain, and for them
    ``encode`` hands the caller's object straight to orjson. Anything else takes the full walk, which
    tags it or raises with the path.
    """
    t = type(value)
    if t is dict or t is list or t is tuple:
        return _plain_container(value, 0, max_depth)
    return _plain_container((value,), -1, max_depth)


def _plain_container(value: Any, depth: int, max_depth: int) -> bool:
    if depth >= max_depth:
        return False
    if type(value) is dict:
        for k in value:
            if type(k) is not str or k == TAG or "\x00" in k:
                return False
        items = value.values()
    else:
        items = value
    # Leaves are checked inline: a call per leaf would cost more than the check itself.
    for v in items:
        t = type(v)
        if t is str:
            if "\x00" in v:
                return False
        elif t is int:
            if not _INT64_MIN <= v <= _INT64_MAX:
                return False
        elif t is float:
            if not -_FLOAT_EXACT < v < _FLOAT_EXACT or (v == 0.0 and math.copysign(1.0, v) < 0.0):
                return False
        elif t is dict or t is list or t is tuple:
            if not _plain_container(v, depth + 1, max_depth):
                return False
        elif t is not bool and v is not None:
            return False
    return True


def _to_json_special(value: Any, depth: int, max_depth: int) -> Any:
    t = type(value)
    if t is _dt.datetime:
        # An offset alone would lose the zone's rules (DST): keep the IANA name when there is one.
        zone = value.tzinfo.key if isinstance(value.tzinfo, ZoneInfo) else None
        if zone is not None:
            return {TAG: "datetime", "v": value.isoformat(), "tz": zone}
        return {TAG: "datetime", "v": value.isoformat()}
    if t is _dt.date:
        return {TAG: "date", "v": value.isoformat()}
    if t is _dt.time:
        return {TAG: "time", "v": value.isoformat()}
    if t is uuid.UUID:
        return {TAG: "uuid", "v": str(value)}
    if t is Decimal:
        if not value.is_finite():
            raise _Bad(f"Decimal {value!r} is not finite", [])
        return {TAG: "decimal", "v": str(value)}
    if t is bytes or t is bytearray or t is memoryview:
        return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode()}
    name = _custom_by_type.get(t)
    if name is not None:
        encode = _custom_by_name[name][1]
        return {TAG: name, "v": _to_json(encode(value), depth + 1, max_depth)}
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "cls": _qualname(t), "v": _to_json(value.value, depth + 1, max_depth)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {TAG: "dataclass", "cls": _qualname(t), "v": _to_json(fields, depth + 1, max_depth)}
    if isinstance(value, (str, int, float, dict, list, tuple)):
        # Subclasses (str enums aside, handled above) lose their type: refuse rather than guess.
        raise _Bad(f"{t.__name__} is a subclass of {type(value).__mro__[1].__name__}; pass the base type", [])
    if isinstance(value, (set, frozenset)):
        raise _Bad(f"{t.__name__} is not supported; convert it to a sorted list", [])
    if callable(value):
        raise _Bad(f"{t.__name__} {getattr(value, '__name__', '')!s} is callable, not data", [])
    raise _Bad(f"{t.__module__}.{t.__qualname__} is not a supported type", [])


def _from_json(value: Any) -> Any:
    t = type(value)
    if t is dict:
        tag = value.get(TAG)
        if tag is None:
            return {k: _from_json(v) for k, v in value.items()}
        return _untag(tag, value)
    if t is list:
        return [_from_json(v) for v in value]
    return value


def _is_dataclass_type(cls: type) -> bool:
    # A plain bool: dataclasses.is_dataclass would narrow ``cls`` to a union object.__new__ refuses.
    return dataclasses.is_dataclass(cls)


def _decode_tree(value: Any) -> Any:
    """:func:`_from_json` with malformed tagged values (damaged or foreign data) as SerializationError."""
    try:
        return _from_json(value)
    except SerializationError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, ArithmeticError, RecursionError) as exc:
        raise SerializationError(
            f"stored record has a malformed tagged value ({type(exc).__name__}: {exc})"
        ) from None


def _untag(tag: str, value: dict[str, Any]) -> Any:
    v: Any = value.get("v")
    if tag == "dict":
        return {k: _from_json(x) for k, x in v.items()}
    if tag == "nulstr":
        return base64.b64decode(v).decode("utf-8", "surrogatepass")
    if tag == "int":
        return int(v)
    if tag == "float":
        number = float(v)
        if type(v) is not str or not math.isfinite(number):
            raise SerializationError(f"stored float {v!r} is not a finite number")
        return number
    if tag == "datetime":
        zone = value.get("tz")
        if zone is not None:
            # The stored offset fixes the instant; the zone gives it back its wall clock and fold.
            return _dt.datetime.fromisoformat(v).astimezone(ZoneInfo(zone))
        return _dt.datetime.fromisoformat(v)
    if tag == "date":
        return _dt.date.fromisoformat(v)
    if tag == "time":
        return _dt.time.fromisoformat(v)
    if tag == "uuid":
        return uuid.UUID(v)
    if tag == "decimal":
        return Decimal(v)
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "enum":
        enum_cls = _resolve_class(value["cls"])
        # Stored data names the class: only ever call an Enum, never an arbitrary class of an imported
        # module (that would let a tampered record run code).
        if not issubclass(enum_cls, enum.Enum):
            raise SerializationError(f"stored enum refers to {value['cls']!r}, which is not an Enum")
        return enum_cls(_from_json(v))
    if tag == "dataclass":
        cls: Any = _resolve_class(value["cls"])
        if not _is_dataclass_type(cls):
            raise SerializationError(f"stored dataclass refers to {value['cls']!r}, which is not a dataclass")
        fields = _from_json(v)
        if type(fields) is not dict:
            raise SerializationError(f"stored dataclass {value['cls']!r} has no field mapping")
        obj = object.__new__(cls)
        # Bypass __init__ (and frozen checks): we restore exactly what was stored.
        for name, field_value in fields.items():
            object.__setattr__(obj, name, field_value)
        return obj
    if tag == "enc":
        # An encrypted field read by a store opened without its key (see statekeel.codec.encryption).
        raise DecryptionError(
            "a stored value is encrypted, but this store was opened without an encryption key",
            kind=None,
            record=None,
            key_id=None,
            hint="Open the store with its encryption_key",
        )
    custom = _custom_by_name.get(tag)
    if custom is not None:
        return custom[2](_from_json(v))
    raise SerializationError(f"stored value has unknown type tag {tag!r}; register it with register_type()")


_BUILTIN_TAGS = frozenset(
    {
        "dict",
        "nulstr",
        "int",
        "float",
        "datetime",
        "date",
        "time",
        "uuid",
        "decimal",
        "bytes",
        "enum",
        "dataclass",
        "enc",
    }
)


class Codec:
    """Encodes values to JSON bytes with limits; decodes them back exactly.

    ``cipher`` (a store's :class:`~statekeel.codec.encryption.Cipher`, None without ``encryption_key``) is
    what the backends seal and open encrypted fields with; plain :meth:`encode` / :meth:`decode` never use it.
    """

    __slots__ = ("cipher", "max_depth", "max_record_bytes")

    def __init__(
        self,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        cipher: Cipher | None = None,
    ) -> None:
        if type(max_record_bytes) is not int or max_record_bytes <= 0:
            raise SerializationError(f"max_record_bytes must be a positive int, got {max_record_bytes!r}")
        if type(max_depth) is not int or max_depth <= 0:
            raise SerializationError(f"max_depth must be a positive int, got {max_depth!r}")
        self.max_record_bytes = max_record_bytes
        self.max_depth = max_depth
        self.cipher = cipher

    def to_json(self, value: Any, *, where: str = "") -> Any:
        """Validate ``value`` and return it as plain JSON types (tagging registered types)."""
        try:
            return _to_json(value, 0, self.max_depth)
        except _Bad as bad:
            path = format_path([*([where] if where else []), *reversed(bad.path)])
            raise SerializationError(f"cannot encode {path}: {bad.reason}", path=path) from None
        except RecursionError:
            raise SerializationError(
                f"cannot encode {where or '<root>'}: nesting too deep", path=where
            ) from None

    def dumps_json(self, plain: Any, *, where: str = "") -> bytes:
        """Serialize an already validated plain-JSON value, enforcing the size limit."""
        try:
            raw = orjson.dumps(plain)
        except (orjson.JSONEncodeError, TypeError) as exc:
            raise SerializationError(f"cannot encode {where or '<root>'}: {exc}", path=where) from None
        if len(raw) > self.max_record_bytes:
            raise PayloadTooLarge(
                f"{where or 'record'} is {len(raw)} bytes encoded, over the limit of {self.max_record_bytes}",
                size=len(raw),
                limit=self.max_record_bytes,
                path=where,
            )
        return raw

    def encode(self, value: Any, *, where: str = "") -> bytes:
        """Encode ``value`` to JSON bytes; raise before returning anything if it is not storable."""
        try:
            plain = _is_plain(value, self.max_depth)
        except RecursionError:
            plain = False  # the full walk reports it with a path
        if plain:
            return self.dumps_json(value, where=where)
        return self.dumps_json(self.to_json(value, where=where), where=where)

    def decode(self, raw: bytes | str) -> Any:
        """Decode bytes written by :meth:`encode` back to the original values."""
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SerializationError(f"stored record is not valid JSON: {exc}") from None
        # Most records have no tagged values: skip the Python walk entirely for them. A one-character
        # search runs as memchr, some 70x faster than the tag's own search on a long history.
        tagged = (
            ("$" in raw and '"$sk"' in raw) if isinstance(raw, str) else (b"$" in raw and _TAG_BYTES in raw)
        )
        return _decode_tree(value) if tagged else value

    def from_json(self, value: Any) -> Any:
        """Undo :meth:`to_json` on a value that was already parsed (e.g. a JSONB column)."""
        return _decode_tree(value)


default_codec = Codec()


def encode(value: Any) -> bytes:
    """Encode with the default limits. See :class:`Codec`."""
    return default_codec.encode(value)


def decode(raw: bytes | str) -> Any:
    """Decode with the default codec. See :class:`Codec`."""
    return default_codec.decode(raw)


def canonical(value: Any) -> bytes:
    """A deterministic encoding (sorted keys) for hashing, e.g. the audit chain and approval arguments."""
    return orjson.dumps(default_codec.to_json(value), option=orjson.OPT_SORT_KEYS)
