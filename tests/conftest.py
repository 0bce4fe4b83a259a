"""Fixtures shared by every test directory."""

from tests.cephfixture import ceph

__all__ = ["ceph"]
