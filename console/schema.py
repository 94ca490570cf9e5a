"""OpenAPI: describe the bearer tokens to drf-spectacular."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `manage.py issue_token`; its scope is its role.",
        }
