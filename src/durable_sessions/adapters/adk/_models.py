"""Rebuild ADK's pydantic models from the JSON the ADK adapter stored, without revalidating.

It reads pydantic's model metadata (validators, private attributes, core schemas) and sets
a model's fields as ``model_construct`` does, through the accessors of the one fenced module
``sql/_private.py``, which checks at import that the installed pydantic has each name they
use (``check()``, run when this module is imported). It never changes a class. It was
checked against pydantic 2.12 to 2.14 (pydantic-core 2.41 to 2.50), google-adk 2.13 and
google-genai 2.34, and is tested against ``model_validate`` (equality, types and
``model_fields_set`` of every nested model) on each supported version. The validators it
knows to be idle are named by module and qualified name (``_NO_OP_VALIDATORS``): if one is
renamed, its model simply takes pydantic's own validation.

Why: an ADK ``Event`` read back with ``Event.model_validate`` costs about 19 us, almost all
of it in two Python "before" validators that do nothing for stored JSON (google-genai's
``_check_field_type_mismatches``, which only logs a warning for a model instance of the
wrong class, and ADK's ``Event._accept_convenience_kwargs``, which only routes the
constructor shortcuts ``message``, ``state``, ``route`` and ``node_path``). A transcript of
20 events then costs more than the database read.

How: for data this adapter wrote itself (``model_dump(mode="json", exclude_none=True)`` of
a validated event), a value whose validation is provably the identity (a ``str`` for a
``str`` field, a known member's value for an enum, a JSON object for ``dict[str, Any]``)
is taken as is, nested models are rebuilt the way ``model_construct`` builds them, and
anything else (bytes, unknown keys, a type the plan does not know, a model with any other
validator) is handed to pydantic's own validation. The fast path thus accepts a strict
subset of what validation accepts, and builds the same objects for it.
"""

from __future__ import annotations

import copy
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

import pydantic
from pydantic_core import PydanticUndefined, SchemaValidator
from pydantic_core import core_schema as cs

from ...sql._private import (
    check,
    core_schema,
    has_custom_init,
    has_post_init,
    is_root_model,
    model_maker,
    model_validators,
    new_model,
    private_attributes,
    sets_only_private_defaults,
)

check()  # the pydantic names the accessors use, with a readable ImportError

__all__ = ["construct", "constructor", "rebuild", "transcript_validator"]

M = typing.TypeVar("M", bound=pydantic.BaseModel)
# Model validators known to change nothing in data dumped by ``model_dump(mode="json")``,
# by (module, qualified name). Any other validator sends its model to ``model_validate``.
_NO_OP_VALIDATORS = {
    ("google.genai._common", "BaseModel._check_field_type_mismatches"),
    ("google.adk.events.event", "Event._accept_convenience_kwargs"),
}
# Field validators known to return an empty value unchanged, by (module, qualified name):
# the fields they check take the fast path only when empty.
_NO_OP_WHEN_EMPTY = {("google.adk.events.event_actions", "EventActions._parse_auth_configs")}
# Keys ``Event._accept_convenience_kwargs`` would route elsewhere: data holding one of them
# is validated normally.
_CONVENIENCE_KEYS = frozenset({"message", "state", "route", "node_path"})
# Classes whose custom ``__init__`` only reshapes a positional argument: keyword data of
# field names (no None values, as ``exclude_none`` dumps them) builds the same model.
_PLAIN_INITS = {("google.genai.types", "Part")}
_IMMUTABLE = (type(None), str, int, float, bool, bytes, tuple, frozenset, enum.Enum)


class _Fallback(Exception):
    """Raised inside the fast path: this value needs pydantic's own validation."""


Convert = Callable[[Any], Any]


def _identity_of(kind: type) -> Convert:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise _Fallback
        return value

    return check


def _to_float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _Fallback


def _any(value: Any) -> Any:
    return value


def _json_object(value: Any) -> Any:
    if type(value) is not dict:
        raise _Fallback
    return value


def _optional(inner: Convert) -> Convert:
    def convert(value: Any) -> Any:
        return None if value is None else inner(value)

    return convert


def _list_of(inner: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise _Fallback
        return [inner(item) for item in value]

    return convert


def _set_of(inner: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise _Fallback
        return {inner(item) for item in value}

    return convert


def _dict_of(inner: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _Fallback
        return {key: inner(item) for key, item in value.items()}

    return convert


def _enum_of(kind: type[enum.Enum]) -> Convert:
    members = {member.value: member for member in kind}  # aliases: their canonical member

    def convert(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            raise _Fallback from None

    return convert


def _literal_of(values: tuple[Any, ...]) -> Convert:
    allowed = {(type(v), v) for v in values}

    def convert(value: Any) -> Any:
        if (type(value), value) not in allowed:
            raise _Fallback
        return value

    return convert


def _scalars_of(kinds: frozenset[type]) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) not in kinds:
            raise _Fallback
        return value

    return convert


def _unsupported(value: Any) -> Any:
    raise _Fallback


_SCALARS = {str: _identity_of(str), int: _identity_of(int), bool: _identity_of(bool)}


def _converter(annotation: Any) -> Convert:
    """Return how to turn JSON into the value validation gives for ``annotation``."""
    if annotation is Any:
        return _any
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is float:
        return _to_float
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is None:
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            return _Plan.of(annotation).build
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return _enum_of(annotation)
        return _unsupported  # bytes, datetimes and the rest: pydantic decides
    if origin is typing.Union or origin is types.UnionType:
        choices = [a for a in args if a is not type(None)]
        inner: Convert
        if len(choices) == 1:
            inner = _converter(choices[0])
        elif all(c in (str, int, bool) for c in choices):
            inner = _scalars_of(frozenset(choices))
        else:
            inner = _unsupported  # a union of containers or models: pydantic's smart mode
        return _optional(inner) if len(choices) < len(args) else inner
    if origin is typing.Literal:
        return _literal_of(args)
    if origin is list and len(args) == 1:
        return _list_of(_converter(args[0]))
    if origin is set and len(args) == 1:
        return _set_of(_converter(args[0]))
    if origin is dict and len(args) == 2 and args[0] is str:
        return _json_object if args[1] is Any else _dict_of(_converter(args[1]))
    return _unsupported


_ANY = frozenset({object})  # a field of type Any: every value is its own validation


def _plain_types(annotation: Any) -> frozenset[type] | None:
    """The exact types whose values validation keeps as they are for ``annotation``, or
    None when values need a converter (models, enums, floats, containers of those...)."""
    if annotation is Any:
        return _ANY
    if annotation in (str, int, bool):
        return frozenset({annotation})
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and args == (str, Any):
        return frozenset({dict})
    if origin is typing.Union or origin is types.UnionType:
        found: set[type] = set()
        for arg in args:
            kinds = frozenset({type(None)}) if arg is type(None) else _plain_types(arg)
            if kinds is None or kinds is _ANY:
                return None
            found |= kinds
        return frozenset(found)
    return None


class _Plan:
    """How to rebuild one model class: a converter per field and its defaults."""

    _plans: typing.ClassVar[dict[type[pydantic.BaseModel], _Plan]] = {}

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.fields: dict[str, Convert] = {}
        self.plain: dict[str, frozenset[type]] = {}
        self.defaults: dict[str, Any] = {}
        self.factories: dict[str, Callable[[], Any]] = {}
        self.copied: dict[str, Any] = {}
        self.template: dict[str, Any] = {}
        self.later: list[str] = []
        self.fast, self.empty_only = _fast_capable(cls)
        # Whether the defaults of absent fields are what validation would put there
        # without validating them (``fill``): what ``finish`` needs.
        self.plain_fields = not cls.model_config.get("validate_default")
        self.post_init = has_post_init(cls)
        # A model_post_init that only sets private attributes' defaults (pydantic's own,
        # for models with private attributes): ``construct`` sets them itself.
        self.own_post_init = self.post_init and not sets_only_private_defaults(cls)
        self.private = {name: a.default for name, a in private_attributes(cls).items()}
        self.private_immutable = all(isinstance(v, _IMMUTABLE) for v in self.private.values())
        self.is_event = cls.__module__ == "google.adk.events.event" and cls.__name__ == "Event"

    @classmethod
    def of(cls, model: type[pydantic.BaseModel]) -> _Plan:
        plan = cls._plans.get(model)
        if plan is None:
            plan = cls._plans[model] = _Plan(model)  # registered first: models may recurse
            plan._fill()
        return plan

    def _fill(self) -> None:
        config = self.cls.model_config
        by_name = config.get("populate_by_name") or config.get("validate_by_name")
        for name, info in self.cls.model_fields.items():
            if info.validate_default:
                self.fast = self.plain_fields = False
            if info.alias not in (None, name) and not by_name:
                self.fast = False
            # Constraints (ge=, max_length=...) are checked by validation: values go there.
            convert = _converter(info.annotation) if self.fast and not info.metadata else None
            if convert is not None and name in self.empty_only:
                convert = _empty_only(convert)
            self.fields[name] = convert or _unsupported
            kinds = _plain_types(info.annotation) if convert is not None else None
            if kinds is not None and name not in self.empty_only:
                self.plain[name] = kinds  # checked inline, without a converter call
            if info.default_factory is not None:
                if getattr(info, "default_factory_takes_data", False):
                    self.fast = self.plain_fields = False  # no data to give it here
                    continue
                self.factories[name] = typing.cast(Callable[[], Any], info.default_factory)
            elif isinstance(info.default, _IMMUTABLE):
                self.defaults[name] = info.default
            elif not info.is_required():
                self.copied[name] = info.default
        self.template = {name: self.defaults.get(name, _UNSET) for name in self.cls.model_fields}
        self.later = [name for name, value in self.template.items() if value is _UNSET]

    def build(self, data: Any) -> Any:
        """Return the model for ``data`` as validation would build it."""
        if type(data) is not dict:
            raise _Fallback
        if not self.fast or (self.is_event and not _CONVENIENCE_KEYS.isdisjoint(data)):
            return self.cls.model_validate(data)
        plain, fields = self.plain, self.fields
        values = self.template.copy()  # every field in declaration order, as validation has
        try:
            for key, value in data.items():
                kinds = plain.get(key)
                if kinds is not None:
                    if kinds is not _ANY and type(value) not in kinds:
                        raise _Fallback
                    values[key] = value
                    continue
                convert = fields.get(key)
                if convert is None:
                    raise _Fallback  # an unknown key (or an alias): pydantic decides
                values[key] = convert(value)
            if self.later:
                self.fill(values)
        except _Fallback:
            return self.cls.model_validate(data)
        model = new_model(self.cls, values, set(data), None)
        if self.post_init:
            model.model_post_init(None)
        return model

    def finisher(self) -> Callable[[dict[str, Any]], Any]:
        """Return ``finish(validated)``: the model whose fields ``validated`` holds, validated
        (the fields the data gave, by name), the absent ones given their defaults; what the
        model's own validator makes once its fields are validated. One call per model of a
        transcript: what it needs is bound once.

        ``finish`` raises ``ValueError`` (which pydantic reports as a ``ValidationError``)
        when a required field is missing.
        """
        template, later, fill = self.template, self.later, self.fill
        make, post_init, name = model_maker(self.cls), self.post_init, self.cls.__name__

        def finish(validated: dict[str, Any]) -> Any:
            values = template.copy()  # every field in declaration order, as validation has
            values.update(validated)
            if later:
                try:
                    fill(values)
                except _Fallback:
                    raise ValueError(f"{name} needs every required field") from None
            model = make(values, set(validated), None)
            if post_init:
                model.model_post_init(None)
            return model

        return finish

    def fill(self, values: dict[str, Any]) -> None:
        """Put the defaults of the fields ``values`` lacks (factories called, copies made)."""
        for name in self.later:
            if values[name] is _UNSET:
                if name in self.factories:
                    values[name] = self.factories[name]()
                elif name in self.copied:
                    values[name] = copy.deepcopy(self.copied[name])
                else:
                    raise _Fallback  # a required field is missing: pydantic says so


_UNSET = object()


def _empty_only(convert: Convert) -> Convert:
    def check(value: Any) -> Any:
        if value:
            raise _Fallback
        return convert(value)

    return check


def _fast_capable(cls: type[pydantic.BaseModel]) -> tuple[bool, frozenset[str]]:
    """Whether ``cls`` has only no-op validators and a plain ``__init__``; and the fields
    that must be empty for their validator to be a no-op."""
    config = cls.model_config
    if config.get("extra") == "allow" or config.get("strict"):
        return False, frozenset()
    if is_root_model(cls):
        return False, frozenset()
    empty_only: set[str] = set()
    for kind, function, fields in model_validators(cls):
        func = getattr(function, "__func__", function)
        key = (getattr(func, "__module__", ""), getattr(func, "__qualname__", ""))
        if key in _NO_OP_VALIDATORS:
            continue
        if kind == "field" and key in _NO_OP_WHEN_EMPTY:
            empty_only.update(fields)
            continue
        return False, frozenset()
    if has_custom_init(cls) and (cls.__module__, cls.__qualname__) not in _PLAIN_INITS:
        return False, frozenset()
    return True, frozenset(empty_only)


def rebuild(model: type[M], data: Any) -> M:
    """Return ``model.model_validate(data)`` for JSON that a dump of ``model`` produced.

    Raises:
        pydantic.ValidationError: as ``model_validate`` does, for data it refuses.
    """
    try:
        return typing.cast(M, _Plan.of(model).build(data))
    except _Fallback:
        return model.model_validate(data)


def construct(model: type[M], values: dict[str, Any], **private: Any) -> M:
    """Build ``model`` from ``values`` that already have their fields' types, with the
    given private attributes: what ``model(**values)`` returns, without validating.

    For values the caller built itself (``str`` ids, a ``dict`` state, a list of events);
    like pydantic's ``model_construct``, about three times faster.
    """
    plan = _Plan.of(model)
    data = plan.template.copy()
    data.update(values)
    try:
        plan.fill(data)
    except _Fallback:
        raise TypeError(f"{model.__name__} needs every required field") from None
    if plan.private_immutable:
        attributes = {**plan.private, **private}
    else:
        attributes = {}
        for name, attribute in private_attributes(model).items():
            default = attribute.get_default()
            if default is not PydanticUndefined:  # as pydantic: no default, no attribute
                attributes[name] = default
        attributes.update(private)
    instance: M = new_model(model, data, set(values), attributes or None)
    if plan.own_post_init:
        instance.model_post_init(None)
    return instance


def constructor(
    model: type[M], names: tuple[str, ...], private_name: str
) -> Callable[[tuple[Any, ...], Any], M]:
    """Return ``make(values, private)``: ``construct(model, dict(zip(names, values)),
    **{private_name: private})``, for many models of one shape (a listing's sessions).

    When ``names`` are every field of ``model`` in declaration order and its one private
    attribute is ``private_name``, with nothing else to set up, ``make`` builds the model
    directly; otherwise it calls ``construct``.
    """
    plan = _Plan.of(model)
    if (
        tuple(model.model_fields) != names
        or set(plan.private) != {private_name}
        or not plan.private_immutable
        or plan.own_post_init
    ):

        def general(values: tuple[Any, ...], private: Any) -> M:
            return construct(
                model, dict(zip(names, values, strict=True)), **{private_name: private}
            )

        return general

    def make(values: tuple[Any, ...], private: Any) -> M:
        fields = dict(zip(names, values, strict=True))
        made: M = new_model(model, fields, set(names), {private_name: private})
        return made

    return make


# -- validating from JSON text ---------------------------------------------------------------

# Before-validators dropped from the JSON validator only if the model they belong to then
# refuses unknown keys: the keys they would route elsewhere fail validation instead, and
# the caller falls back to ``model_validate`` (ADK's ``Event`` ignores unknown keys).
_ROUTING_VALIDATORS = {("google.adk.events.event", "Event._accept_convenience_kwargs")}


def _validator_key(node: dict[str, Any]) -> tuple[str, str]:
    function = node["function"]
    function = function.get("function") if isinstance(function, dict) else function
    function = getattr(function, "__func__", function)
    return (getattr(function, "__module__", ""), getattr(function, "__qualname__", ""))


def _strip(node: Any) -> Any:
    """A copy of a core schema without the no-op before-validators (``_NO_OP_VALIDATORS``),
    and each model that can be built without its class's validator (``_as_fields``) as its
    fields' validation followed by ``_Plan.finisher``. Nothing of the classes is changed."""
    if isinstance(node, list):
        return [_strip(item) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "function-before" and _validator_key(node) in _NO_OP_VALIDATORS:
        inner = _strip(node["schema"])
        if _validator_key(node) in _ROUTING_VALIDATORS and inner.get("type") == "model-fields":
            inner["extra_behavior"] = "forbid"
        return inner
    if kind == "model" and _own_no_op(node["cls"]):
        built = _as_fields(node)
        if built is not None:
            return built
    return {key: _strip(value) for key, value in node.items()}


def _own_no_op(cls: type[pydantic.BaseModel]) -> bool:
    """Whether a model class has a validator of its own that ``_strip`` drops. A model
    without one keeps its ``model`` node, whose validator pydantic-core builds the model
    with: the same model, and the quicker way (no Python call per model)."""
    for _, function, _ in model_validators(cls):
        func = getattr(function, "__func__", function)
        key = (getattr(func, "__module__", ""), getattr(func, "__qualname__", ""))
        if key in _NO_OP_VALIDATORS:
            return True
    return False


def _as_fields(node: dict[str, Any]) -> Any | None:
    """A model's core schema as a typed dict of its fields (their own validation, the
    model's config) whose output ``_Plan.finisher`` makes the model: what the model node does,
    without the class's prebuilt validator, which pydantic-core takes in place of any
    ``model`` node of a complete class (and with it the validators ``_strip`` drops).
    None when the model needs what only its own node does (a custom ``__init__``, a root
    model, extra fields kept, a default validated or built from the data)."""
    cls = node["cls"]
    plan = _Plan.of(cls)
    custom = node.get("custom_init") and (cls.__module__, cls.__qualname__) not in _PLAIN_INITS
    if custom or node.get("root_model") or not plan.plain_fields:
        return None
    inner = _strip(node["schema"])
    if inner.get("type") != "model-fields" or inner.get("extra_behavior") == "allow":
        return None
    fields = {}
    for name, field in inner["fields"].items():
        schema = field["schema"]
        required = schema.get("type") != "default"
        fields[name] = cs.typed_dict_field(
            schema if required else schema["schema"],
            required=required,
            validation_alias=field.get("validation_alias"),
        )
    typed = cs.typed_dict_schema(
        fields,
        extra_behavior=inner.get("extra_behavior"),
        strict=inner.get("strict"),
        config=node.get("config"),
    )
    return cs.no_info_after_validator_function(plan.finisher(), typed, ref=node.get("ref"))


def transcript_validator(event: type[pydantic.BaseModel]) -> SchemaValidator:
    """Return a validator of a store's events as JSON text (``get_with_events_json``):
    an array of ``[seq, id, author, invocation_id, content, state_delta, tokens, micros]``
    whose ``content`` is validated as ``event``, straight from the text.

    What it builds is what ``event.model_validate(json.loads(content))`` builds, but for
    the provably idle before-validators (``_NO_OP_VALIDATORS``), which it skips: the text
    is parsed and validated by pydantic-core, each model finished by ``_Plan.finisher``,
    about twice as fast as decoding it and rebuilding (``rebuild``). Content with a key
    ``event`` does not declare fails instead (so that ``Event``'s shortcuts ``message``,
    ``state``... are never dropped): callers fall back to ``model_validate`` on any
    ``ValidationError``. It is built from a copy of ``event``'s core schema: no class is
    changed.
    """
    stripped = _strip(core_schema(event))
    fields = [cs.int_schema(), *[cs.any_schema() for _ in range(3)], stripped]
    item = cs.tuple_schema([*fields, cs.any_schema(), cs.any_schema(), cs.int_schema()])
    return SchemaValidator(cs.list_schema(item))
