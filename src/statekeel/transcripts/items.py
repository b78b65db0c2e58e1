"""Items from provider SDKs (pydantic models, OpenAI Responses items) as plain JSON."""

from __future__ import annotations

from typing import Any

from ..errors import (
    InvalidArgument,
    SerializationError,
)
from .messages import (
    valid_id,
)

# --- items from provider SDKs ----------------------------------------------------------------------------

_MAX_NESTING = 64


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _dump(value: Any, depth: int) -> Any:
    if type(value) in _LEAVES:  # most of a message: nothing to look up
        return value
    dump = getattr(value, "model_dump", None)
    if dump is not None and callable(dump) and not isinstance(value, type):
        try:
            # As the SDKs' own to_dict(): the fields the API sent or the caller set, by their API names.
            return dump(mode="json", by_alias=True, exclude_unset=True)
        except Exception as exc:
            raise SerializationError(
                f"{type(value).__name__}.model_dump(mode='json') failed: {exc}", type=type(value).__name__
            ) from exc
    if depth >= _MAX_NESTING:
        return value  # the codec refuses what is nested too deep, with its path
    if type(value) is dict:
        out: dict[Any, Any] | None = None
        for k, v in value.items():
            new = _dump(v, depth + 1)
            if new is not v:
                out = dict(value) if out is None else out
                out[k] = new
        return value if out is None else out
    if type(value) is list:
        items: list[Any] | None = None
        for n, v in enumerate(value):
            new = _dump(v, depth + 1)
            if new is not v:
                items = list(value) if items is None else items
                items[n] = new
        return value if items is None else items
    return value


def role_of(message: Any) -> str | None:
    """What a stored message's role is: its non-empty str ``role``, or for an item without one (OpenAI
    Responses) its non-empty str ``type``; None for anything else, which is not a message."""
    if type(message) is not dict:
        return None
    role = message.get("role")
    if valid_id(role):
        return role
    kind = message.get("type")
    return kind if role is None and valid_id(kind) else None


def normalize_item(item: Any) -> dict[str, Any]:
    """A message or provider item as the plain dict statekeel stores.

    Pydantic models (anything with ``model_dump(mode="json")``: the OpenAI and Anthropic SDKs' messages,
    output items and content blocks), also nested in a dict's values or a list, become their JSON dump — the
    fields the API sent or the caller set — so that validating the stored dict gives back an equal model.
    A dict is returned as it is unless it holds such models. The result must have a non-empty str ``role``
    (chat and Anthropic messages) or ``type`` (Responses items, which have no role).

        item = normalize_item(response.output[0])   # {"type": "function_call", "call_id": ..., ...}
    """
    value = _dump(item, 0)
    if type(value) is not dict:
        raise InvalidArgument(
            f"a message must be a dict or a pydantic model, got {type(item).__name__}",
            type=type(item).__name__,
        )
    role, kind = value.get("role"), value.get("type")
    if not valid_id(role) and not valid_id(kind):
        raise InvalidArgument(
            "a message needs a non-empty str 'role' (chat and Anthropic messages) or 'type' (Responses "
            f"items); got role={role!r}, type={kind!r}"
        )
    return value
