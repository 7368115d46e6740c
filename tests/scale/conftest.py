"""The scale tier (`make test-scale`): the long scenarios, on the same local stack as tests/e2e."""

from tests.e2e.conftest import stack

__all__ = ["stack"]
