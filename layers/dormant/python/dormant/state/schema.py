"""The app's schema: scope name -> pydantic model, and how one key of a scope is validated and read.

Values are held in the ledger (and the derived state) as JSON. A write is validated with the model's
own field validators (``validate_assignment`` on a model built from the current values, so
``field_validator`` and ``model_validator`` run too) and stored as the field's JSON form; a read
turns the JSON back into the field's type (a nested model comes back as that model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, JsonValue, TypeAdapter, ValidationError

from ..errors import SchemaError, StateValidationError
from .values import json_copy

__all__ = ["APP_SCOPE_ID", "SCOPES", "SHARED_SCOPES", "Schema", "ScopeSchema"]

SHARED_SCOPES: tuple[str, ...] = ("user", "patient", "practice", "org", "team", "app")
SCOPES: tuple[str, ...] = ("session", *SHARED_SCOPES, "temp")
APP_SCOPE_ID = "app"
"""The id the ``app`` scope is stored under: it needs no binding, every session of the app shares it."""

# Attribute names the state views keep for themselves: a session key cannot be called this.
RESERVED_KEYS = frozenset({"update", "get", "keys", "to_dict"}) | frozenset(SCOPES)

_JSON: TypeAdapter[Any] = TypeAdapter(JsonValue)


@dataclass
class ScopeSchema:
    """One scope's model (``None``: untyped, any JSON value under any key)."""

    name: str
    model: type[BaseModel] | None
    _readers: dict[str, TypeAdapter[Any]] = field(default_factory=dict, repr=False)
    # Looked up on every state read: computed once (pydantic's ``model_fields`` is not a plain attribute).
    open: bool = field(init=False)
    """Whether keys the model does not declare are accepted."""
    fields: frozenset[str] = field(init=False)
    """The keys the model declares."""

    def __post_init__(self) -> None:
        self.open = self.model is None or self.model.model_config.get("extra") == "allow"
        self.fields = frozenset(self.model.model_fields) if self.model is not None else frozenset()

    def declares(self, key: str) -> bool:
        return key in self.fields

    def validate(self, current: Mapping[str, Any], key: str, value: Any) -> Any:
        """Validate ``value`` for ``key`` given the scope's current JSON values; return its JSON form."""
        if self.model is None or (not self.declares(key) and self.open):
            return self._plain_json(key, value)
        if not self.declares(key):
            raise StateValidationError(
                f"{self.name} state has no key {key!r} (declared: {', '.join(self.model.model_fields) or 'none'})",
                scope=self.name,
                key=key,
            )
        instance = self.model.model_construct(**current)
        try:
            self.model.__pydantic_validator__.validate_assignment(instance, key, value)
        except ValidationError as exc:
            raise StateValidationError(
                f"invalid value for {self.name}.{key}: {exc.errors()[0]['msg']}", scope=self.name, key=key
            ) from exc
        return instance.model_dump(mode="json", include={key}).get(key)

    def seed(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON values to seed: ``given`` validated by the model, with its defaults filled in.

        Keys the model does not declare are refused, as a ``state`` write refuses them (errors name
        ``initial_state.<scope>.<key>``).
        """
        field = f"initial_state.{self.name}"
        if self.model is None:
            return {key: self._plain_json(key, value, field=f"{field}.{key}") for key, value in given.items()}
        if not self.open:
            unknown = sorted(str(key) for key in given if not self.declares(key))
            if unknown:
                raise StateValidationError(
                    f"{self.name} state has no key {unknown[0]!r} "
                    f"(declared: {', '.join(self.model.model_fields) or 'none'})",
                    scope=self.name,
                    key=unknown[0],
                    field=f"{field}.{unknown[0]}",
                )
        try:
            instance = self.model.model_validate(dict(given))
        except ValidationError as exc:
            first = exc.errors()[0]
            key = str(first["loc"][0]) if first["loc"] else "?"
            raise StateValidationError(
                f"invalid initial {self.name} state at {key!r}: {first['msg']}",
                scope=self.name,
                key=key,
                field=f"{field}.{key}",
            ) from exc
        return instance.model_dump(mode="json")

    def read(self, key: str, value: Any) -> Any:
        """The typed value of ``key`` from its stored JSON (a fresh object: mutating it changes nothing)."""
        if value is None:
            return self.default(key)
        reader = self._reader(key)
        copy = json_copy(value)
        if reader is None:
            return copy
        try:
            return reader.validate_python(copy)
        except ValidationError:
            return copy  # written under an older schema: hand back what is stored

    def default(self, key: str) -> Any:
        if self.model is None or key not in self.model.model_fields:
            return None
        info = self.model.model_fields[key]
        if info.is_required():
            return None
        default = info.get_default(call_default_factory=True, validated_data={})
        return json_copy(default) if isinstance(default, dict | list) else default

    def _reader(self, key: str) -> TypeAdapter[Any] | None:
        if key in self._readers:
            return self._readers[key]
        reader = None
        if self.model is not None and key in self.model.model_fields:
            info = self.model.model_fields[key]
            annotation: Any = info.annotation
            reader = TypeAdapter(Annotated[annotation, *info.metadata]) if info.metadata else TypeAdapter(annotation)
        self._readers[key] = reader  # type: ignore[assignment]
        return reader

    def _plain_json(self, key: str, value: Any, field: str | None = None) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        try:
            return _JSON.validate_python(value)
        except ValidationError as exc:
            raise StateValidationError(
                f"{self.name}.{key} must be a JSON value (str, int, float, bool, list, dict), "
                f"not {type(value).__name__}",
                scope=self.name,
                key=key,
                field=field,
            ) from exc


class Schema:
    """Scope name -> ``ScopeSchema``; checked once, at ``adk()``."""

    def __init__(self, models: Mapping[str, Any] | None = None) -> None:
        models = dict(models or {})
        for scope, model in models.items():
            if scope not in SCOPES:
                raise SchemaError(f"unknown scope {scope!r} in schema (scopes: {', '.join(SCOPES)})", scope=str(scope))
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise SchemaError(f"schema[{scope!r}] must be a pydantic model class, not {model!r}", scope=scope)
        session = models.get("session")
        if session is not None:
            clash = sorted(RESERVED_KEYS & set(session.model_fields))
            if clash:
                raise SchemaError(
                    f"session state cannot have a key named {clash[0]!r}: the state view uses that name",
                    scope="session",
                )
        self.scopes: dict[str, ScopeSchema] = {name: ScopeSchema(name, model) for name, model in models.items()}
        if "session" not in self.scopes:
            self.scopes["session"] = ScopeSchema("session", None)

    def __contains__(self, scope: object) -> bool:
        return scope in self.scopes

    def __getitem__(self, scope: str) -> ScopeSchema:
        return self.scopes[scope]
