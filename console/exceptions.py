"""One error shape for the whole API: {"error": code, "detail": text, ...}."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler


class ApiError(Exception):
    """An application error with its HTTP status and any extra body fields."""

    def __init__(self, status_code: int, code: str, detail: str, **extra):
        super().__init__(detail)
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.extra = extra


def api_exception_handler(exc, context):
    if isinstance(exc, ApiError):
        return Response(
            {"error": exc.code, "detail": exc.detail, **exc.extra}, status=exc.status_code
        )
    response = exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    code = getattr(exc, "default_code", "error")
    if isinstance(data, dict) and set(data) == {"detail"}:
        code = getattr(data["detail"], "code", code)  # Http404 arrives as DRF's NotFound
        response.data = {"error": code, "detail": str(data["detail"])}
    elif response.status_code == status.HTTP_400_BAD_REQUEST:
        response.data = {"error": "invalid", "detail": "The request is invalid.", "fields": data}
    return response
