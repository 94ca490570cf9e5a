"""OpenAPI: how drf-spectacular describes the API beyond what the views declare.

- the bearer tokens (an authentication extension);
- the one error shape, `{"error": code, "detail": text, ...}`, as the component `Error`,
  and the error answers every operation can give, added once here rather than on every
  view: 400 (a NUL in any query parameter is refused), 401 and 403 (all need a role),
  503 (database away, with Retry-After), 404 where there is a path parameter or a page,
  415 where DRF parses the body (a view that reads the raw body names its media types
  in `extend_schema(request={media_type: ...})`); a view declares the others it gives
  (409, 413) and may describe any of them in its own words, and they get the error shape;
- query parameters as the views read them: an empty value is no value, no NUL;
- string fields of request bodies as DRF reads them: no NUL, not blank unless allowed;
- PATCH bodies as their serializers validate them: no view here reads a partial body;
- a serializer with `refuses_unknown_fields = True` documents a closed object;
- a fault injection's body, one shape per kind.
"""

from django.core.validators import RegexValidator
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
)
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

ERROR_COMPONENT = "Error"
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error answer of the API. Some add fields: `field`, `fields`,"
    " `errors`, or what the error names (`jobs`, `guardrail`...).",
    "properties": {
        "error": {
            "type": "string",
            "description": "a stable code: invalid, invalid_parameter, invalid_body,"
            " invalid_events, not_authenticated, authentication_failed, permission_denied,"
            " not_found, conflict, too_large, unavailable...",
        },
        "detail": {"type": "string", "description": "what is wrong, for a person"},
        "field": {"type": "string", "description": "the parameter or body field at fault"},
        "fields": {
            "type": "object",
            "additionalProperties": True,
            "description": "an invalid body: each field's problems",
        },
        "errors": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": True},
            "description": "each problem of a batch: its index, field or name, and reason",
        },
    },
    "required": ["error", "detail"],
    "additionalProperties": True,
}
ERROR_DESCRIPTIONS = {
    "400": "invalid parameters or body, named in `field`, `fields` or `errors`",
    "401": "no token, or an unknown or revoked one",
    "403": "the role may not do this",
    "404": "no such object, or no such page",
    "409": "the state does not allow it",
    "413": "the body is too large",
    "415": "a body of a content type the operation does not read",
    "503": "the database is away for a moment: retry after `Retry-After` seconds",
}
NO_NUL_PATTERN = r"^[^\u0000]*$"
# Python's str.strip() whitespace, spelled out: ECMA's \s is not quite the same set.
_SPACE = r"\t\n\v\f\r \u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK_PATTERN = rf"^[^\u0000]*[^\u0000{_SPACE}][^\u0000]*$"
RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "seconds to wait before sending again",
        "required": True,
    }
}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `manage.py issue_token`; its scope is its role.",
        }


class FaultRequestScheme(OpenApiSerializerExtension):
    """A fault injection, one shape per kind: each kind requires what it needs
    (recovery.faults.FAULTS), and a slow factor is at least 1."""

    target_class = "recovery.api.serializers.FaultSerializer"

    def map_serializer(self, auto_schema, direction):
        from recovery.faults import FAULTS

        base = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        shapes = []
        for kind, fault in FAULTS.items():
            # Wrapped: drf-spectacular's enum hook would merge the kinds' one-value enums.
            only_this_kind = {"allOf": [{"type": "string", "enum": [kind]}]}
            properties = {**base["properties"], "kind": only_this_kind}
            if kind == "slow":
                properties["factor"] = {**properties["factor"], "minimum": 1}
            shapes.append(
                {
                    "type": "object",
                    "title": kind,
                    "description": fault.what,
                    "properties": properties,
                    "required": ["kind", *fault.needs],
                }
            )
        return {"oneOf": shapes, "description": base.get("description", "")}


class ReboundAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        error = ResolvedComponent(
            name=ERROR_COMPONENT,
            type=ResolvedComponent.SCHEMA,
            schema=ERROR_SCHEMA,
            object=ERROR_COMPONENT,
        )
        self.registry.register_on_missing(error)
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "query":
                self._describe_query_parameter(parameter)
        responses = operation["responses"]
        for code in self._error_codes(operation):
            responses.setdefault(code, {})
        for code, response in responses.items():
            if code >= "400":
                response["content"] = {"application/json": {"schema": error.ref}}
                response["description"] = response.get("description") or ERROR_DESCRIPTIONS.get(
                    code, ""
                )
                if code == "503":
                    response["headers"] = RETRY_AFTER
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    @staticmethod
    def _describe_query_parameter(parameter) -> None:
        schema = parameter.setdefault("schema", {})
        if parameter["name"] == "page":
            # DRF's paginator reads an empty ?page= as the first page; 0 is no page (404).
            schema.update({"type": "integer", "minimum": 1})
        if not parameter.get("required"):
            parameter["allowEmptyValue"] = True  # an empty value is no value: ?state=
        if schema.get("type") == "string" and not {"enum", "pattern"} & set(schema):
            schema["pattern"] = NO_NUL_PATTERN  # refused in any query parameter (400)

    def _error_codes(self, operation) -> set[str]:
        # 400 everywhere: a NUL in any query parameter is refused before any view.
        codes = {"400", "401", "403", "503"}
        where = {p["in"] for p in operation.get("parameters", []) if p["name"] != "page"}
        body = operation.get("requestBody")
        if "path" in where or any(p["name"] == "page" for p in operation.get("parameters", [])):
            codes.add("404")
        # A view that names its body's media types itself reads the raw body (ingest);
        # the others parse it with their parsers, which refuse another content type.
        if body and not isinstance(self.get_request_serializer(), dict):
            codes.add("415")
        return codes

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (
            direction == "request"
            and isinstance(field, serializers.CharField)
            and schema.get("type") == "string"
            and not {"enum", "pattern"} & set(schema)
            and not any(isinstance(v, RegexValidator) for v in field.validators)
        ):
            # DRF refuses a NUL in any string, and a blank one (once trimmed) where
            # blank is not allowed.
            blank_refused = field.trim_whitespace and not field.allow_blank
            schema["pattern"] = NOT_BLANK_PATTERN if blank_refused else NO_NUL_PATTERN
        return schema

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        # DRF ignores unknown fields; a body read by other means may refuse them.
        if getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def _get_request_for_media_type(self, serializer, direction="request"):
        # drf-spectacular makes every PATCH body partial (all fields optional), as DRF's
        # UpdateModelMixin would; our PATCH views validate their bodies whole.
        method = self.method
        self.method = "POST" if method == "PATCH" else method
        try:
            return super()._get_request_for_media_type(serializer, direction)
        finally:
            self.method = method
