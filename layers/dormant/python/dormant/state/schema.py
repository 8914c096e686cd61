"""The app's schema: scope name -> pydantic model, and how one key of a scope is validated and read.

Values are held in the ledger (and the derived state) as JSON. A write is validated with the model's
own field validators (``validate_assignment`` on a model built from the current values, so
``field_validator`` and ``model_validator`` run too) and stored as the field's JSON form; a read
turns the JSON back into the field's type (a nested model comes back as that model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import SchemaError, StateMigrationError, StateValidationError
from ..events import StateChange, StateChangeEvent
from ..ids import check_scoped_key
from .migrations import ConvertKey, MigrationStep, RenameKey, SplitKey, apply_step
from .values import check_storable, json_copy, json_values

__all__ = ["APP_SCOPE_ID", "BOUND_SCOPES", "SCOPES", "SHARED_SCOPES", "Schema", "ScopeSchema"]

SHARED_SCOPES: tuple[str, ...] = ("user", "patient", "practice", "org", "team", "app")
BOUND_SCOPES: tuple[str, ...] = SHARED_SCOPES[:-1]
"""The shared scopes a session is bound to by id (``app`` needs no binding)."""
SCOPES: tuple[str, ...] = ("session", *SHARED_SCOPES, "temp")
APP_SCOPE_ID = "app"
"""The id the ``app`` scope is stored under: it needs no binding, every session of the app shares it."""

# Attribute names the state views keep for themselves: a session key cannot be called this.
RESERVED_KEYS = frozenset({"update", "get", "keys", "to_dict"}) | frozenset(SCOPES)


_CONTAINERS = (dict, list)
"""What a JSON value read from the fold may hold inside (``isinstance(v, dict | list)`` builds a union per call)."""

# A shared-scope value stored by a scope at schema version > 0 is wrapped so its version travels with it
# (other sessions, and other releases, write the same keys): {VERSION: n, VALUE: value}.
_STORED_VERSION = "__schema_version__"
_STORED_VALUE = "__value__"


@dataclass
class ScopeSchema:
    """One scope's model (``None``: untyped, any JSON value under any key)."""

    name: str
    model: type[BaseModel] | None
    steps: tuple[MigrationStep, ...] = ()
    """The migrations the scope's model went through, oldest first: its version is their number."""
    _readers: dict[str, TypeAdapter[Any]] = field(default_factory=dict, repr=False)
    # Looked up on every state read: computed once (pydantic's ``model_fields`` is not a plain attribute).
    open: bool = field(init=False)
    """Whether keys the model does not declare are accepted."""
    fields: frozenset[str] = field(init=False)
    """The keys the model declares."""

    def __post_init__(self) -> None:
        self.open = self.model is None or self.model.model_config.get("extra") == "allow"
        self.fields = frozenset(self.model.model_fields) if self.model is not None else frozenset()

    @property
    def version(self) -> int:
        return len(self.steps)

    def declares(self, key: str) -> bool:
        return key in self.fields

    def upcast(self, key: str, value: Any, version: int) -> dict[str, Any]:
        """``{key: JSON value}`` in the current model's shape for ``key`` = ``value`` written at ``version``.

        A value at the current version (or a newer one, from a later release) is returned as it is. A
        value the steps cannot bring to the current model raises ``StateMigrationError``.
        """
        if version >= self.version:
            return {key: value}
        values = {key: value}
        try:
            for step in self.steps[max(version, 0) :]:
                values = {k: v for old, item in values.items() for k, v in self._step(step, old, item, key, version)}
        except StateMigrationError:
            raise
        except Exception as exc:
            raise StateMigrationError(self.name, key, version, self.version, f"its migration failed: {exc}") from exc
        return {k: None if v is None else self._current_json(k, v, key, version) for k, v in values.items()}

    def _step(self, step: MigrationStep, key: str, value: Any, source: str, version: int) -> Iterable[tuple[str, Any]]:
        values = apply_step(step, key, value)
        if isinstance(step, SplitKey) and key == step.key:
            stray = sorted(set(values) - set(step.into))
            if stray:
                raise StateMigrationError(
                    self.name, source, version, self.version, f"its split returned {stray[0]!r}, not one of {step.into}"
                )
        return values.items()

    def _current_json(self, key: str, value: Any, source: str, version: int) -> Any:
        if self.model is None or (self.open and not self.declares(key)):
            try:
                return self._plain_json(key, value)
            except StateValidationError as exc:
                raise StateMigrationError(self.name, source, version, self.version, str(exc)) from exc
        reader = self._reader(key)
        if reader is None:
            raise StateMigrationError(
                self.name, source, version, self.version, f"it becomes key {key!r}, which the model does not declare"
            )
        try:
            return reader.dump_python(reader.validate_python(value), mode="json")
        except ValidationError as exc:
            raise StateMigrationError(
                self.name, source, version, self.version, f"{key!r} is refused: {exc.errors()[0]['msg']}"
            ) from exc

    def stored_form(self, value: Any) -> Any:
        """What a shared-scope value is stored as: tagged with the version once the scope has migrations.

        A deletion is stored too, as a tagged ``None``: a key an older model stored under another name
        (``RenameKey``, ``SplitKey``) would otherwise show through again once the new key is gone.
        """
        if not self.steps:
            return value
        return {_STORED_VERSION: self.version, _STORED_VALUE: value}

    def from_store(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """A shared scope as stored, upcast to the current model (a newer key wins over an older one)."""
        tagged = []
        for key, item in stored.items():
            if isinstance(item, dict) and item.keys() == {_STORED_VERSION, _STORED_VALUE}:
                tagged.append((item[_STORED_VERSION], key, item[_STORED_VALUE]))
            else:
                tagged.append((0, key, item))
        values: dict[str, Any] = {}
        for version, key, item in sorted(tagged, key=lambda entry: entry[0]):
            values.update(self.upcast(key, item, version))
        return {key: value for key, value in values.items() if value is not None}

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

    def check_write(
        self,
        current: Mapping[str, Any],
        key: Any,
        value: Any,
        *,
        key_field: str,
        value_field: str,
        unknown_field: str | None = None,
    ) -> Any:
        """The JSON form of ``value`` written to ``key`` (``None``: a deletion), by the one set of rules every
        writer of every scope meets — a run, ``state``, a remote runner's ``scoped_changes`` and ``state_change``
        events alike: a key follows the key rule (1 to 128 characters, no NUL or lone surrogate); a model
        declares it (unless open); the model's validators take the value; the result is storable. ``current``
        are the scope's JSON values the write lands on. Errors name ``key_field`` (a key that is no key),
        ``unknown_field`` (a key the model does not declare; default ``key_field``) or ``value_field``."""
        check_scoped_key(key, key_field)  # the one key rule (dormant.ids), as every store checks it
        if value is None:
            return None
        try:
            checked = self.validate(current, key, value)
        except StateValidationError as exc:
            exc.field = value_field if self.declares(key) or self.open else (unknown_field or key_field)
            raise
        check_storable(checked, value_field)
        return checked

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
        reader = self._readers[key] if key in self._readers else self._reader(key)
        copy = json_copy(value) if type(value) in _CONTAINERS else value  # a scalar needs no copy
        if reader is None:
            return copy
        try:
            return reader.validator.validate_python(copy)  # the core validator: TypeAdapter's wrapper adds a call
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
            return json_values().validate_python(value)
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

    def __init__(self, models: Mapping[str, Any] | None = None, migrations: Mapping[str, Any] | None = None) -> None:
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
        steps = _check_migrations(migrations, models)
        self.scopes: dict[str, ScopeSchema] = {
            name: ScopeSchema(name, model, steps.get(name, ())) for name, model in models.items()
        }
        if "session" not in self.scopes:
            self.scopes["session"] = ScopeSchema("session", None, steps.get("session", ()))
        # Read on every load from a snapshot: worked out once (the scopes and their steps are fixed here).
        self.versions: dict[str, int] = {name: scope.version for name, scope in self.scopes.items() if scope.version}
        """Scope -> schema version, for the scopes with migrations (what a derived snapshot must match; not to be
        changed)."""
        self.upcaster: Callable[[StateChangeEvent], StateChangeEvent] | None = self.upcast if self.versions else None
        """``upcast`` for a fold, or ``None`` when no scope has migrations: the fold then skips it per event."""

    def upcast(self, event: StateChangeEvent) -> StateChangeEvent:
        """``event`` as the current model reads it: itself when current, else a migrated copy to fold.

        The copy's ``old_value``s are ``None``: it is only folded into derived state, the ledger keeps the original.
        """
        scope = self.scopes.get(event.scope)
        if scope is None or event.schema_version >= scope.version:
            return event
        changes = [
            StateChange(key=key, new_value=value)
            for change in event.changes
            for key, value in scope.upcast(change.key, change.new_value, event.schema_version).items()
        ]
        return event.model_copy(update={"changes": changes, "schema_version": scope.version})

    def __contains__(self, scope: object) -> bool:
        return scope in self.scopes

    def __getitem__(self, scope: str) -> ScopeSchema:
        return self.scopes[scope]


def _check_migrations(
    migrations: Mapping[str, Any] | None, models: Mapping[str, Any]
) -> dict[str, tuple[MigrationStep, ...]]:
    if migrations is None:
        return {}
    if not isinstance(migrations, Mapping):
        raise SchemaError(f"migrations is a dict of scope -> list of steps, not {migrations!r}")
    checked: dict[str, tuple[MigrationStep, ...]] = {}
    for scope, steps in migrations.items():
        if scope not in SCOPES or scope == "temp":
            raise SchemaError(f"migrations for unknown scope {scope!r}", scope=str(scope))
        if scope not in models and scope != "session":
            raise SchemaError(f"migrations for scope {scope!r}, which the schema does not declare", scope=scope)
        if isinstance(steps, str | bytes) or not isinstance(steps, list | tuple):
            raise SchemaError(f"migrations[{scope!r}] is a list of steps, oldest first", scope=scope)
        for step in steps:
            if not isinstance(step, RenameKey | ConvertKey | SplitKey):
                raise SchemaError(
                    f"migrations[{scope!r}] holds {step!r}: a step is RenameKey, ConvertKey or SplitKey", scope=scope
                )
        checked[scope] = tuple(steps)
    return checked
