"""botocore's ``ClientError``, recognised by *error code* (never by message text).

botocore is imported lazily, so importing an adapter never imports it.
"""

from __future__ import annotations


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for anything else)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def client_error_type() -> type[Exception]:
    """botocore's ClientError, imported lazily so importing an adapter never imports botocore."""
    from botocore.exceptions import ClientError

    return ClientError  # type: ignore[no-any-return]
