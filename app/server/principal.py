"""Who a request acts for. Quotas, capacity and rate limits are kept per principal.

Until credentials exist every request acts for one local owner; an authentication layer that puts its principal's
id on `request.state.principal` (a string, or an object with an `id`) is picked up here with no other change.
"""

from fastapi import Request

LOCAL_OWNER = "local"


def principal_of(request: Request) -> str:
    principal = getattr(request.state, "principal", None)
    if principal is None:
        return LOCAL_OWNER
    if isinstance(principal, str):
        return principal
    return str(getattr(principal, "id", principal))


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"
