"""`radixkv.tenancy`: principal names, salt digests, scoped namespaces and who sees what."""

import pytest

from radixkv.errors import InvalidRequestError
from radixkv.tenancy import namespace, owner, principal_of, salt_namespace, visible


def test_a_principal_is_a_stable_digest_of_its_key_never_the_key():
    assert principal_of("k1") == principal_of("k1") != principal_of("k2")
    assert "k1" not in principal_of("k1").removeprefix("principal:")


def test_a_salt_is_kept_only_as_its_digest_and_checked():
    assert salt_namespace(None) is None
    assert salt_namespace("secret") == salt_namespace("secret") != salt_namespace("other")
    assert "secret" not in salt_namespace("secret")
    for bad in ("", "x" * 257, 7):
        with pytest.raises(InvalidRequestError, match="cache_salt"):
            salt_namespace(bad)


def test_namespaces_are_scoped_to_their_owner():
    k1, k2 = principal_of("k1"), principal_of("k2")
    salted = salt_namespace("s")
    assert namespace("", None) is None and namespace("", salted) == salted  # one principal: unchanged
    assert namespace(k1, salted) != namespace(k2, salted)  # a salt is bound to its key
    assert owner(namespace(k1, salted)) == owner(namespace(k1, None)) == k1
    assert owner(None) == owner(salted) == owner("tenant-b") == owner(7) == ""  # in-process names: shared
    assert visible(namespace(k1, None), k1) and not visible(namespace(k1, None), k2)
    assert visible(namespace(k1, None), None) and visible(None, "")
