import pytest

import radixkv as rk
from tests.server_helpers import API_KEY


@pytest.fixture(scope="session")
def runtime(default_engine):
    return rk.Runtime(engine=default_engine)


@pytest.fixture(scope="session")
def endpoint(server):
    return rk.RuntimeEndpoint(server.url, api_key=API_KEY)


@pytest.fixture(params=["runtime", "endpoint"])
def backend(request):
    """Each test runs on the in-process runtime and over HTTP."""
    return request.getfixturevalue(request.param)
