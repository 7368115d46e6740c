"""Who calls the API: a tenant bound to its role's unique id, or an operator."""

from __future__ import annotations

import pytest

from swarm.core.memory import MemoryBindings
from swarm.service.api_models import Caller, Forbidden, caller_of

ACCOUNT = "123456789012"
TENANTS, OPERATORS = "swarm-tenant-", "swarm-operator-"


def arn(role: str, account: str = ACCOUNT) -> str:
    return f"arn:aws:sts::{account}:assumed-role/{role}/session"


def test_tenants_and_operators_by_role_name_in_the_stacks_account() -> None:
    tenant = caller_of(arn("swarm-tenant-acme"), "AROAAAA:session", TENANTS, OPERATORS, ACCOUNT)
    assert tenant == Caller("acme", "AROAAAA") and not tenant.operator
    operator = caller_of(arn("swarm-operator-ops"), "AROABBB:s", TENANTS, OPERATORS, ACCOUNT)
    assert operator.operator and operator.tenant is None
    # an operator role of another account is nobody here; a bare prefix is no role
    for role, account in (("swarm-operator-ops", "999999999999"), ("swarm-operator-", ACCOUNT)):
        with pytest.raises(Forbidden):
            caller_of(arn(role, account), None, TENANTS, OPERATORS, ACCOUNT)
    # an IAM user's id (AIDA...) is not a role id: nothing to bind
    assert caller_of(arn("swarm-tenant-a"), "AIDAXYZ", TENANTS, OPERATORS, ACCOUNT).role_id is None


def test_a_tenant_binds_to_its_first_role_and_a_recreated_role_waits_for_a_rebind() -> None:
    bindings = MemoryBindings()
    assert bindings.bind("acme", "AROAFIRST", 1.0) and bindings.bind("acme", "AROAFIRST", 2.0)
    assert not bindings.bind("acme", "AROASECOND", 3.0)  # same name, a new role
    assert bindings.bind("globex", "AROASECOND", 3.0)  # other tenants are not affected
    assert bindings.unbind("acme") and not bindings.unbind("acme")
    assert bindings.bind("acme", "AROASECOND", 4.0)
